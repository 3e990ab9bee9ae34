"""The full analysis of a batch of images: capture once, then every analysis on the captured arrays.

The CLI writes its result to ``analysis.npz``; the app and the benchmarks call the same function.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image

from .capture import capture
from .distance import CONVENTION as DISTANCE_CONVENTION
from .distance import mean_attention_distance
from .filters import patch_filter_pca, patch_filters
from .images import preprocess
from .layout import TokenLayout
from .models import LoadedModel
from .posembed import patch_position_embeddings, position_embedding_similarity
from .rollout import attention_gradients, gradient_rollout, rollout
from .tokens import AttentionSinks, artifact_tokens, attention_sinks


@dataclass(frozen=True)
class AnalysisSettings:
    """Parameters of the analyses, recorded in settings.json.

    Args:
        fusion: rollout head fusion, ``"mean"``, ``"max"`` or ``"min"``.
        discard: fraction of the lowest weights zeroed per layer in rollout.
        start_layer, end_layer: rollout layer range [start, end); None = the last layer.
        exclude_artifacts: keep high-norm artifact tokens (last layer, >10x median) out of rollout.
        exclude_sinks: keep patch attention sinks (any layer of the range) out of rollout.
        target_class: class for gradient rollout; None = each image's top-1.
        batch_size: images per forward pass.
    """

    fusion: str = "mean"
    discard: float = 0.0
    start_layer: int = 0
    end_layer: int | None = None
    exclude_artifacts: bool = False
    exclude_sinks: bool = False
    target_class: int | None = None
    batch_size: int = 8


@dataclass
class Analysis:
    """Attributes:
        arrays: named as in the README: input, attention, features, logits, token_norms, rollout,
            rollout_per_layer, mean_distance, mean_distance_per_image, filter_pca,
            filter_pca_explained, posembed_similarity, gradient_rollout (those that apply).
        info: JSON-able facts for settings.json: parameters, conventions, artifact tokens, notes.
        input_images: the model-input images (after resize and crop), for overlays.
        layout: the token layout of the captured sequence.
    """

    arrays: dict[str, np.ndarray]
    info: dict
    input_images: list[Image.Image]
    layout: TokenLayout


def excluded_tokens(settings: AnalysisSettings, artifacts: np.ndarray, sinks: AttentionSinks,
                     layout: TokenLayout) -> tuple[int, ...]:
    """Token indices kept out of rollout by the settings: artifacts and/or patch sinks of the layer range."""
    tokens = set(artifacts.tolist()) if settings.exclude_artifacts else set()
    if settings.exclude_sinks:
        layers = range(settings.start_layer, settings.end_layer or len(sinks.sinks))
        tokens |= {int(p) + layout.num_prefix_tokens for p in sinks.patch_sinks(layout, layers)}
    return tuple(sorted(tokens))


def analyze_images(loaded: LoadedModel, images: list[Image.Image],
                   settings: AnalysisSettings = AnalysisSettings()) -> Analysis:
    """Capture B RGB images once and run every analysis on the result."""
    batch = preprocess(images, loaded.data_config)
    parts = [capture(loaded.model, batch.tensor[i:i + settings.batch_size])
             for i in range(0, len(images), settings.batch_size)]
    layout = parts[0].layout
    attention = torch.cat([p.attention for p in parts]).numpy()
    norms = torch.cat([p.token_norms for p in parts]).numpy()
    arrays = {
        "input": batch.tensor.numpy(),
        "attention": attention,
        "features": torch.cat([p.features for p in parts]).numpy(),
        "token_norms": norms,
    }
    if parts[0].logits is not None:
        arrays["logits"] = torch.cat([p.logits for p in parts]).numpy()

    artifacts = [artifact_tokens(n[-1], layout) for n in norms]
    sinks = [attention_sinks(a, layout) for a in attention]
    rollouts = [rollout(a, layout, fusion=settings.fusion, discard=settings.discard, start=settings.start_layer,
                        end=settings.end_layer, exclude_tokens=excluded_tokens(settings, art, sink, layout))
                for a, art, sink in zip(attention, artifacts, sinks)]
    arrays["rollout"] = np.stack([r.map for r in rollouts])
    arrays["rollout_per_layer"] = np.stack([r.per_layer for r in rollouts])
    arrays["mean_distance_per_image"] = mean_attention_distance(attention, layout)
    arrays["mean_distance"] = arrays["mean_distance_per_image"].mean(axis=0)

    info = {
        "settings": asdict(settings),
        "token_layout": layout.to_dict(),
        "artifact_tokens": [a.tolist() for a in artifacts],
        "attention_sinks_per_layer": [[s.tolist() for s in sink.sinks] for sink in sinks],
        "rollout": {"layers": list(rollouts[0].layers), "readout": rollouts[0].readout,
                    "prefix_share": [r.prefix_share for r in rollouts],
                    "definition": "per layer: fuse heads, discard lowest fraction (never the readout column), "
                                  "0.5 A + 0.5 I, rows renormalised; R = A'_end ... A'_start"},
        "mean_distance_convention": DISTANCE_CONVENTION,
        "notes": [],
    }
    try:
        pca = patch_filter_pca(patch_filters(loaded.model))
        arrays["filter_pca"], arrays["filter_pca_explained"] = pca.components, pca.explained_variance_ratio
    except ValueError as exc:
        info["notes"].append(str(exc))
    try:
        emb = patch_position_embeddings(loaded.model, layout)
        arrays["posembed_similarity"] = position_embedding_similarity(emb, layout.grid_size)
    except ValueError as exc:
        info["notes"].append(str(exc))
    if loaded.has_head:
        maps, targets = [], []
        for i in range(len(images)):
            a, g, target = attention_gradients(loaded.model, batch.tensor[i:i + 1], settings.target_class)
            maps.append(gradient_rollout(a, g, layout))
            targets.append(target)
        arrays["gradient_rollout"] = np.stack(maps)
        info["gradient_rollout_targets"] = targets
    else:
        info["notes"].append("Gradient rollout needs a classifier head; this model has none.")
    return Analysis(arrays=arrays, info=info, input_images=batch.images, layout=layout)
