"""Cached models (read as :class:`vitviz.Lens`) and per-image analysis. All model mutation happens inside ``cached_model``.

Everything lives in one byte-bounded LRU (:mod:`ui.memo`) shared by every session and thread,
budget ``VITVIZ_CACHE_MB``: models, per-image results keyed by (spec, image SHA-256) and derived
analyses keyed by (spec, SHA-256, parameters). Capture never writes to a cached model; pages only
read cached values. A slider move never runs the model again while its result fits the budget.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import streamlit as st
from PIL import Image

from vitviz.runs.analysis import AnalysisSettings, excluded_tokens
from vitviz.analyses.per_image import ImageAnalyses, analyse_images
from vitviz.sources.preprocess import preprocess
from vitviz.lens import Lens
from vitviz.sources.models import LoadedModel, ModelSpec, load_model, with_labels
from vitviz.analyses.posembed import patch_position_embeddings, position_embedding_similarity
from vitviz.analyses.rollout import class_gradient_rollout, rollout
from vitviz.settings import Settings
from vitviz.analyses.tokens import feature_pca_rgb, top_classes

from .memo import ByteLRU
from .runs import RunLimiter


@st.cache_resource(show_spinner=False)
def operator_settings() -> Settings:
    """The operator's settings, read once per server from the environment."""
    return Settings.from_env()


@st.cache_resource(show_spinner=False)
def store() -> ByteLRU:
    """The one cache every session shares (a resource, so it survives script reloads)."""
    return ByteLRU(operator_settings().cache_bytes)


@st.cache_resource(show_spinner=False)
def run_limiter() -> RunLimiter:
    """The server's one limit on model runs at once (``VITVIZ_MAX_RUNS``), shared by every session."""
    return RunLimiter(operator_settings().max_runs)


@contextmanager
def model_run():
    """Hold one of the server's model-run slots for the ``with`` block; a session that must wait is told why."""
    notice = st.empty()

    def waiting(n: int) -> None:
        notice.info(f"Waiting for {n} other run{'s' if n != 1 else ''} to finish (this server runs at most "
                    f"{run_limiter().limit} at once) ...")

    with run_limiter().slot(waiting):
        notice.empty()
        yield


def _spinning(message: str, compute):
    """``compute`` under a spinner: shown only when something actually runs, not on a cache hit."""
    def run():
        with st.spinner(message):
            return compute()
    return run


def _model_run(message: str, compute):
    """``compute`` runs the model: under a spinner, holding one of the server's run slots."""
    def run():
        with model_run(), st.spinner(message):
            return compute()
    return run


def cached_lens(spec: ModelSpec) -> Lens:
    """The model ``spec`` names, loaded once per server and shared by every session (read-only).

    The store holds the loaded model (:func:`cached_model`); a :class:`vitviz.Lens` is a view of it that costs
    nothing to build, so every caller gets the same model, layout and adapter.
    """
    return Lens(cached_model(spec))


def cached_model(spec: ModelSpec) -> LoadedModel:
    """The loaded model (:class:`vitviz.sources.models.LoadedModel`); pages read it through :func:`cached_lens`."""
    if spec.labels is not None:  # names change no weight: one cached model for every set of names
        return with_labels(cached_model(replace(spec, labels=None)), spec.labels)
    if spec.head is not None:  # the probe wraps the cached backbone, nothing copied (vitviz.probes.head)
        from vitviz.probes.head import attach_head

        return attach_head(cached_model(replace(spec, head=None)), spec.head)
    return store().get_or_compute(("model", spec), _spinning("Loading the model ...", lambda: load_model(spec)))


def model_is_cached(spec: ModelSpec) -> bool:
    return ("model", replace(spec, labels=None, head=None)) in store()


# Shared, not copied: st.cache_data would unpickle a copy of the attention (19 MB for the
# bundled model, ~500 MB for ViT-L/16 @384) on every rerun. Pages only read it.
def cached_image_result(spec: ModelSpec, sha256: str, _image: Image.Image) -> ImageAnalyses:
    """One image through the model, on the host: its trace and per-image analyses
    (:class:`vitviz.analyses.per_image.ImageAnalyses`), everything the pages draw from."""
    return store().get_or_compute(("image", spec, sha256),
                                  _model_run("Running the model ...", lambda: _image_result(spec, _image)))


def _image_result(spec: ModelSpec, _image: Image.Image) -> ImageAnalyses:
    return analyse_images(cached_model(spec), [_image]).image(0)


def cached_rollout(spec: ModelSpec, sha256: str, _result: ImageAnalyses, settings: AnalysisSettings,
                   query: int | None = None, extra_tokens: tuple[int, ...] = ()):
    """Rollout of the readout, or of patch ``query`` (raster order, 0-based) when one was clicked; ``extra_tokens``
    (sequence indices, e.g. the padding patches') are kept out besides the settings' exclusions."""
    def compute():
        exclude = tuple(sorted(set(excluded_tokens(settings, _result.artifacts, _result.sinks, _result.layout))
                               | set(extra_tokens)))
        return rollout(_result.attention, _result.layout, fusion=settings.fusion, discard=settings.discard,
                       start=settings.start_layer, end=settings.end_layer, exclude_tokens=exclude, query=query)

    return store().get_or_compute(("rollout", spec, sha256, settings, query, tuple(extra_tokens)), compute)


def cached_gradient_rollout(spec: ModelSpec, sha256: str, _image: Image.Image, target: int | None):
    def compute():
        loaded = cached_model(spec)
        batch = preprocess([_image], loaded.data_config)
        return class_gradient_rollout(loaded.model, batch.tensor, loaded.layout, target)

    return store().get_or_compute(("gradient_rollout", spec, sha256, target),
                                  _model_run("Computing gradients ...", compute))


def cached_feature_pca(spec: ModelSpec, sha256: str, _result: ImageAnalyses) -> np.ndarray:
    return store().get_or_compute(("feature_pca", spec, sha256),
                                  lambda: feature_pca_rgb(_result.features, _result.layout))


def cached_top_classes(spec: ModelSpec, sha256: str, _result: ImageAnalyses, k: int = 5):
    return store().get_or_compute(("top_classes", spec, sha256, k),
                                  lambda: top_classes(_result.logits, k, cached_model(spec).class_labels))


def cached_position_similarity(spec: ModelSpec, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Position embeddings (gh*gw, D) resampled to ``shape`` and their similarity (gh, gw, gh, gw).

    In the byte-bounded store: a 40x40 grid's similarity is 20 MB, so a count bound says nothing.
    """
    def compute():
        loaded = cached_model(spec)
        embeddings = patch_position_embeddings(loaded.model, loaded.layout, shape, native=loaded.native_pos_embed)
        return embeddings, position_embedding_similarity(embeddings, shape)

    return store().get_or_compute(("position_similarity", spec, shape), compute)
