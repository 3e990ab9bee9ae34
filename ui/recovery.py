"""Recovery from a model that fails to load: say why, keep showing the last model that loaded, and put the
sidebar's boxes back on it (one rerun), so what the sidebar names is what the pages show.
"""
from __future__ import annotations

import streamlit as st

from vitviz.errors import VitvizError
from vitviz.lens import Lens
from vitviz.settings import SUGGESTED_MODELS
from vitviz.sources.budget import admit, admit_fitted
from vitviz.sources.models import BUNDLED, ModelSpec, search_models
from vitviz.sources.names import parse_model_name

from . import keys
from .cache import cached_lens, operator_settings
from .keys import KEPT
from .model_box import HUGGING_FACE, TIMM_BY_NAME, open_model
from .widgets import choose, chosen, forget, reseed


def _model_boxes() -> tuple:
    """The model boxes' values as the user last set them."""
    return tuple(chosen(key) for key in keys.MODEL_BOXES)


def _back_to(previous: ModelSpec, failed: ModelSpec) -> bool:
    """Put the sidebar's model widgets back on ``previous`` (their kept values seed them on the next run).

    Returns whether anything changed, i.e. whether a rerun shows ``previous`` in the sidebar. An uploaded
    checkpoint that failed is dropped from its uploader; a head box that failed is left as it is (the sentence
    names it).
    """
    before = dict(st.session_state)
    kind = parse_model_name(previous.name).kind
    if kind != "timm" and parse_model_name(failed.name).kind == "timm" and failed.name != previous.name:
        # A timm pick that failed: the box stays on timm names with nothing picked, since the checkpoint boxes for
        # that architecture live there (the README's fine-tune path: pick the architecture, give the checkpoint).
        forget(keys.TIMM_NAME)
    elif kind == "timm":
        choose(keys.MODEL_CHOICE, TIMM_BY_NAME)
        if previous.name not in (search_models(chosen(keys.TIMM_QUERY, "")) or SUGGESTED_MODELS):
            choose(keys.TIMM_QUERY, previous.name)
        choose(keys.TIMM_NAME, previous.name)
    else:
        choose(keys.MODEL_CHOICE, BUNDLED if kind == "bundled" else HUGGING_FACE)
        if kind != "bundled":
            choose(keys.HF_NAME, previous.name)
        forget(keys.TIMM_NAME)  # back on the timm box later, the failed name is not picked
    if kind not in ("transformers", "torchvision"):
        forget(keys.HF_NAME)
    choose(keys.IMG_SIZE, previous.img_size or 0)
    choose(keys.DEVICE, previous.device)
    choose(keys.DTYPE, previous.dtype)
    uploads = st.session_state.get(keys.CKPT_UPLOADS, {})
    if failed.checkpoint in uploads and failed.checkpoint != previous.checkpoint:
        st.session_state[keys.CKPT_GENERATION] = st.session_state.get(keys.CKPT_GENERATION, 0) + 1
    elif failed.checkpoint != previous.checkpoint:
        choose(keys.CKPT_PATH, previous.checkpoint if previous.checkpoint and previous.checkpoint not in uploads else "")
    moved = {k for k in set(st.session_state) | set(before)
             if (k.startswith(KEPT) or k == keys.CKPT_GENERATION) and before.get(k) != st.session_state.get(k)}
    reseed(k.removeprefix(KEPT) for k in moved)
    return bool(moved)


def _still_showing(previous: ModelSpec, back: str = "") -> str:
    at = f"at {previous.img_size} px" if previous.img_size else "at its own resolution"
    return (f"Still showing the previous model ({previous.name}) {at}: {back}the maps below are its, not the "
            "requested setting's.")


def load(spec: ModelSpec) -> tuple[ModelSpec, Lens]:
    """The requested model; if it fails, say why, keep the previous one and put the sidebar back on it.

    A spec that failed is not tried again in this session (a slider move must not repeat a
    28 s failure); its sentence is shown again. After a failure the sidebar's widgets go back to the
    model that loaded last (one rerun), and the sentence stays above the page until another model is chosen.
    """
    failed: dict[ModelSpec, str] = st.session_state.setdefault(keys.FAILED_SPECS, {})
    note = st.session_state.get(keys.LOAD_FAILURE)
    if note is not None and (note[2] != spec or note[3] != _model_boxes()):
        st.session_state.pop(keys.LOAD_FAILURE)  # another choice in the model boxes: the last failure's sentence goes
    elif note is not None:
        st.error(note[0])
        again = (" (for its architecture with your own weights: give the checkpoint below, then pick it again)"
                 if parse_model_name(note[1].name).kind == "timm" and not note[1].checkpoint else "")
        st.info(_still_showing(spec, f"the sidebar no longer names {note[1].name}{again}; "))
    try:
        if spec in failed:
            raise VitvizError(failed[spec])
        admit(spec, operator_settings())
        lens = open_model(spec)
        admit_fitted(lens.loaded, operator_settings())  # the architecture a checkpoint was fitted to
        st.session_state[keys.GOOD_SPEC] = spec
        st.session_state.pop(keys.REVERTED_FROM, None)
        return spec, lens
    except VitvizError as exc:
        failed[spec] = str(exc)
        previous = st.session_state.get(keys.GOOD_SPEC, ModelSpec())
        if previous != spec and st.session_state.get(keys.REVERTED_FROM) != spec and _back_to(previous, spec):
            st.session_state[keys.REVERTED_FROM] = spec  # once per failure: a revert that does not take is not retried
            st.session_state[keys.LOAD_FAILURE] = (str(exc), spec, previous, _model_boxes())
            st.rerun()
        st.error(str(exc))
        if previous != spec:
            st.info(_still_showing(previous))
        try:
            return previous, open_model(previous)
        except VitvizError:
            return ModelSpec(), cached_lens(ModelSpec())
