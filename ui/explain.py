"""Cached computations of the explanatory views (token clusters, attention anatomy).

Kept in :mod:`ui.cache`'s one byte-bounded store (``VITVIZ_CACHE_MB``), keyed like it: (kind, spec,
image SHA-256, parameters). Both re-run the model only up to the layer asked for, once per image and
layer; head, query and K changes only redraw. Values are shared between sessions: pages only read them.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from vitviz.analyses.anatomy import LayerQKV, block_output, layer_qkv
from vitviz.analyses.clusters import TokenClusters, token_clusters
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.sources.models import ModelSpec

from .cache import _model_run, _spinning, cached_model, store

FINAL, BLOCK, KEYS = "final features", "output of a block", "keys of one head"
CLUSTER_SOURCES = (FINAL, BLOCK, KEYS)


def _model_input(spec: ModelSpec, image: Image.Image):
    loaded = cached_model(spec)
    return loaded.model, preprocess([image], loaded.data_config).tensor


def cached_layer_qkv(spec: ModelSpec, sha256: str, _image: Image.Image, layer: int) -> LayerQKV:
    def compute():
        model, x = _model_input(spec, _image)
        return layer_qkv(model, x, layer)

    return store().get_or_compute(("layer_qkv", spec, sha256, layer),
                                  _model_run("Computing q, k and v of this layer ...", compute))


def cached_block_output(spec: ModelSpec, sha256: str, _image: Image.Image, layer: int) -> np.ndarray:
    def compute():
        model, x = _model_input(spec, _image)
        return block_output(model, x, layer)[0].float().cpu().numpy()

    return store().get_or_compute(("block_output", spec, sha256, layer), _model_run("Running the blocks ...", compute))


def cached_clusters(spec: ModelSpec, sha256: str, _image: Image.Image, _result: ImageAnalyses, source: str,
                    layer: int, head: int, k: int) -> TokenClusters:
    """k-means of the patch tokens: ``source`` in CLUSTER_SOURCES; layer/head 0-based (ignored where unused)."""
    def compute():
        layout = _result.layout
        if source == FINAL:
            tokens = _result.features
        elif source == BLOCK:
            tokens = cached_block_output(spec, sha256, _image, layer)
        else:
            tokens = cached_layer_qkv(spec, sha256, _image, layer).k[head]
        return token_clusters(tokens[layout.patch_slice], layout.grid_size, k)

    return store().get_or_compute(("clusters", spec, sha256, source, layer, head, k),
                                  _spinning("Clustering the tokens ...", compute))
