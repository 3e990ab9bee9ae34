"""Cached computations of the explanatory views (token clusters, attention anatomy).

Keyed like :mod:`ui.cache`: (spec, image SHA-256, parameters). Both re-run the model only up to
the layer asked for, once per image and layer; head, query and K changes only redraw.
"""
from __future__ import annotations

import numpy as np
import streamlit as st
from PIL import Image

from vitviz.anatomy import LayerQKV, block_output, layer_qkv
from vitviz.clusters import TokenClusters, token_clusters
from vitviz.images import preprocess
from vitviz.models import ModelSpec

from .cache import ImageResult, cached_model

FINAL, BLOCK, KEYS = "final features", "output of a block", "keys of one head"
CLUSTER_SOURCES = (FINAL, BLOCK, KEYS)


def _model_input(spec: ModelSpec, image: Image.Image):
    loaded = cached_model(spec)
    return loaded.model, preprocess([image], loaded.data_config).tensor


@st.cache_data(max_entries=32, show_spinner="Computing q, k and v of this layer ...")
def cached_layer_qkv(spec: ModelSpec, sha256: str, _image: Image.Image, layer: int) -> LayerQKV:
    model, x = _model_input(spec, _image)
    return layer_qkv(model, x, layer)


@st.cache_data(max_entries=32, show_spinner="Running the blocks ...")
def cached_block_output(spec: ModelSpec, sha256: str, _image: Image.Image, layer: int) -> np.ndarray:
    model, x = _model_input(spec, _image)
    return block_output(model, x, layer)[0].float().cpu().numpy()


@st.cache_data(max_entries=64, show_spinner="Clustering the tokens ...")
def cached_clusters(spec: ModelSpec, sha256: str, _image: Image.Image, _result: ImageResult, source: str,
                    layer: int, head: int, k: int) -> TokenClusters:
    """k-means of the patch tokens: ``source`` in CLUSTER_SOURCES; layer/head 0-based (ignored where unused)."""
    layout = _result.layout
    if source == FINAL:
        tokens = _result.features
    elif source == BLOCK:
        tokens = cached_block_output(spec, sha256, _image, layer)
    else:
        tokens = cached_layer_qkv(spec, sha256, _image, layer).k[head]
    return token_clusters(tokens[layout.patch_slice], layout.grid_size, k)
