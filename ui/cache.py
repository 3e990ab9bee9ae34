"""Cached model and per-image analysis. All model mutation happens inside ``cached_model``.

``st.cache_resource`` holds one model per ModelSpec for every session and thread; capture never
writes to it. Per-image results are keyed by (spec, image SHA-256) and derived analyses by
(spec, SHA-256, parameters), all bounded: a slider move never runs the model again.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st
from PIL import Image

from vitviz.analysis import AnalysisSettings, excluded_tokens
from vitviz.capture import capture
from vitviz.distance import mean_attention_distance
from vitviz.images import preprocess
from vitviz.layout import TokenLayout
from vitviz.maps import head_scores
from vitviz.models import ModelSpec, load_model
from vitviz.rollout import attention_gradients, gradient_rollout, rollout
from vitviz.tokens import AttentionSinks, artifact_tokens, attention_sinks, feature_pca_rgb, top_classes


@st.cache_resource(show_spinner="Loading the model ...", max_entries=3)
def cached_model(spec: ModelSpec):
    return load_model(spec)


@dataclass
class ImageResult:
    """One image through the model: everything the pages draw from."""

    attention: np.ndarray        # (L, H, N, N)
    token_norms: np.ndarray      # (L, N)
    features: np.ndarray         # (N, D)
    logits: np.ndarray | None    # (C,)
    model_input: Image.Image     # after resize/crop
    layout: TokenLayout
    artifacts: np.ndarray        # token indices, last layer >10x median norm
    distance: np.ndarray         # (L, H) mean attention distance, pixels
    head_scores: dict            # name -> (L, H): entropy, cls_focus, distance (for ranking heads)
    sinks: AttentionSinks        # tokens receiving a disproportionate share of attention, per layer


# A resource, not data: st.cache_data would unpickle a copy of the attention (19 MB for the
# bundled model, ~500 MB for ViT-L/16 @384) on every rerun. Pages only read it.
@st.cache_resource(max_entries=32, show_spinner="Running the model ...")
def cached_image_result(spec: ModelSpec, sha256: str, _image: Image.Image) -> ImageResult:
    loaded = cached_model(spec)
    batch = preprocess([_image], loaded.data_config)
    out = capture(loaded.model, batch.tensor)
    norms = out.token_norms[0].numpy()
    attention = out.attention[0].numpy()
    distance = mean_attention_distance(out.attention.numpy(), out.layout)[0]
    return ImageResult(
        attention=attention, token_norms=norms, features=out.features[0].numpy(),
        logits=None if out.logits is None else out.logits[0].numpy(), model_input=batch.images[0],
        layout=out.layout, artifacts=artifact_tokens(norms[-1], out.layout),
        distance=distance, head_scores=head_scores(attention, out.layout, distance),
        sinks=attention_sinks(attention, out.layout),
    )


@st.cache_data(max_entries=64, show_spinner=False)
def cached_rollout(spec: ModelSpec, sha256: str, _result: ImageResult, settings: AnalysisSettings):
    exclude = excluded_tokens(settings, _result.artifacts, _result.sinks, _result.layout)
    return rollout(_result.attention, _result.layout, fusion=settings.fusion, discard=settings.discard,
                   start=settings.start_layer, end=settings.end_layer, exclude_tokens=exclude)


@st.cache_data(max_entries=32, show_spinner="Computing gradients ...")
def cached_gradient_rollout(spec: ModelSpec, sha256: str, _image: Image.Image, target: int | None):
    loaded = cached_model(spec)
    batch = preprocess([_image], loaded.data_config)
    attention, grads, target = attention_gradients(loaded.model, batch.tensor, target)
    return gradient_rollout(attention, grads, loaded.layout), target


@st.cache_data(max_entries=32, show_spinner=False)
def cached_feature_pca(spec: ModelSpec, sha256: str, _result: ImageResult) -> np.ndarray:
    return feature_pca_rgb(_result.features, _result.layout)


@st.cache_data(max_entries=32, show_spinner=False)
def cached_top_classes(spec: ModelSpec, sha256: str, _result: ImageResult, k: int = 5):
    return top_classes(_result.logits, k)
