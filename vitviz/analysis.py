"""The full analysis of a batch of images: capture once, then every analysis on the captured arrays.

The CLI writes its result to ``analysis.npz``; the app and the benchmarks call the same function.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image

from .capture import capture
from .clusters import batch_clusters
from .distance import CONVENTION as DISTANCE_CONVENTION
from .distance import mean_attention_distance
from .faithfulness import PROTOCOL, attention_maps, default_fractions, perturbation_curves
from .filters import patch_filter_pca, patch_filters
from .flow import FLOW_DEFINITION, attention_flow
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
        faithfulness: deletion/insertion curves of every attribution map (see vitviz.faithfulness).
        faithfulness_steps: fractions 0..1 of the curves, evenly spaced.
        flow: attention flow (exact max-flow) with the rollout's fusion, discard, layers and exclusions.
        clusters: k-means clusters of each image's patch tokens (2..12); None = no clustering.
        cluster_layer: 0-based block whose output is clustered; None = the final features.
    """

    fusion: str = "mean"
    discard: float = 0.0
    start_layer: int = 0
    end_layer: int | None = None
    exclude_artifacts: bool = False
    exclude_sinks: bool = False
    target_class: int | None = None
    batch_size: int = 8
    faithfulness: bool = False
    faithfulness_steps: int = 11
    flow: bool = False
    clusters: int | None = None
    cluster_layer: int | None = None


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
    cluster_info = None
    if settings.clusters is not None:
        arrays["clusters"], inertia = batch_clusters(loaded.model, batch.tensor, arrays["features"], layout,
                                                     settings.clusters, settings.cluster_layer, settings.batch_size)
        cluster_info = {"k": settings.clusters, "inertia_per_image": inertia,
                        "layer (1-based)": "final features" if settings.cluster_layer is None
                        else settings.cluster_layer + 1,
                        "features": "final-norm patch tokens (npz 'features')" if settings.cluster_layer is None
                        else "patch tokens leaving that block, before the final norm",
                        "method": "k-means per image (scikit-learn, k-means++, 10 inits, seed 0), "
                                  "labels 0..K-1 by cluster size, largest first"}

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
    if cluster_info is not None:
        info["clusters"] = cluster_info
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
    if settings.flow:
        flows = [attention_flow(a, layout, fusion=settings.fusion, discard=settings.discard,
                                start=settings.start_layer, end=settings.end_layer,
                                exclude_tokens=excluded_tokens(settings, art, sink, layout))
                 for a, art, sink in zip(attention, artifacts, sinks)]
        arrays["attention_flow"] = np.stack([f.map for f in flows])
        info["attention_flow"] = {"layers": list(flows[0].layers), "readout": flows[0].readout,
                                  "capacity_scale": flows[0].scale, "definition": FLOW_DEFINITION,
                                  "max_error_bound": float(max(f.error_bound.max() for f in flows))}
    if settings.faithfulness:
        info["faithfulness"] = add_faithfulness(loaded, batch.tensor, arrays, layout, settings)
    return Analysis(arrays=arrays, info=info, input_images=batch.images, layout=layout)


def add_faithfulness(loaded: LoadedModel, inputs: torch.Tensor, arrays: dict[str, np.ndarray], layout: TokenLayout,
                     settings: AnalysisSettings) -> dict:
    """Deletion/insertion curves of every map in ``arrays`` on every image; adds ``faithfulness_fractions`` (S,),
    ``deletion`` and ``insertion`` (B, M, S) to ``arrays`` and returns their description for settings.json."""
    fractions = default_fractions(settings.faithfulness_steps)
    results = []
    for i in range(len(inputs)):
        maps = attention_maps(arrays["attention"][i], layout, rollout_map=arrays["rollout"][i],
                              gradient_map=arrays["gradient_rollout"][i] if "gradient_rollout" in arrays else None,
                              flow_map=arrays["attention_flow"][i] if "attention_flow" in arrays else None)
        results.append(perturbation_curves(loaded.model, inputs[i], maps, layout, fractions=fractions,
                                           target=settings.target_class, batch_size=settings.batch_size))
    arrays["faithfulness_fractions"] = fractions
    arrays["deletion"] = np.stack([r.deletion for r in results])
    arrays["insertion"] = np.stack([r.insertion for r in results])
    return {"protocol": PROTOCOL, "methods": results[0].methods,
            "method_maps": "rollout, gradient_rollout, attention_flow: the npz arrays of those names; "
                           "last_layer_*: the readout's raw attention in the last layer (heads 1-based); "
                           "random: uniform noise, numpy default_rng(0)",
            "score": [r.score for r in results], "target_class": [r.target for r in results],
            "patches_per_step": results[0].counts.tolist(),
            "auc": [{m: {"deletion": float(d), "insertion": float(s)}
                     for m, d, s in zip(r.methods, r.deletion_auc, r.insertion_auc)} for r in results],
            "reference": [r.reference() for r in results]}
