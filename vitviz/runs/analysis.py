"""The full analysis of a batch of images: capture once, then every analysis on the captured arrays.

The CLI writes its result to ``analysis.npz``; the app and the benchmarks call the same function.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from PIL import Image

from ..analyses.per_image import analysis_trace
from ..lens import Lens
from ..sources.preprocess import preprocess
from ..trace import Trace
from ..analyses.batched import (batch_artifacts, batch_gradient_rollout, batch_rollout, batch_sinks,
                                reduce_attention)
from ..analyses.batched import rollouts as batch_rollouts
from ..analyses.clusters import batch_clusters
from ..analyses.distance import CONVENTION as DISTANCE_CONVENTION
from ..perturbation.curves import attention_maps, default_fractions, perturbation_curves
from ..perturbation.protocols import protocol_text
from ..analyses.filters import patch_filter_pca, patch_filters
from ..analyses.flow import FLOW_DEFINITION, attention_flow
from ..layout import TokenLayout
from ..sources.models import LoadedModel
from ..analyses.posembed import patch_position_embeddings, position_embedding_similarity
from ..tensors import to_host
from ..analyses.tokens import AttentionSinks


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
        faithfulness: deletion/insertion curves of every attribution map (see vitviz.perturbation.curves).
        faithfulness_steps: fractions 0..1 of the curves, evenly spaced.
        flow: attention flow (exact max-flow) with the rollout's fusion, discard, layers and exclusions.
        clusters: k-means clusters of each image's patch tokens (2..12); None = no clustering.
        cluster_layer: 0-based block whose output is clustered; None = the final features.
        attribution: map methods (:mod:`vitviz.explainers`) to run (target: ``target_class``'s logit, default
            each image's top-1, or the pooled vector's projection for a model without a head).
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
    attribution: tuple[str, ...] = ()


@dataclass
class Analysis:
    """The arrays and facts ``analyze`` writes, for one batch (:func:`analyze_batch`) or a whole run
    (:func:`analyze_images`); what the forward saw is its :class:`vitviz.trace.Trace`, not this.

    Attributes:
        arrays: named as in the README, leading axis the images where per image: input, attention (unless left
            out), features, token_norms, logits, clusters, rollout, rollout_per_layer, mean_distance_per_image,
            gradient_rollout, attention_flow, deletion, insertion; for a run also mean_distance, filter_pca,
            filter_pca_explained, posembed_similarity (those that apply).
        input_images: the model-input images (after resize and crop), for overlays.
        layout: the token layout of the captured sequence.
        facts: a batch's per-image JSON facts, each a list of length b, gathered by :class:`AnalysisRun`.
        run_facts: a batch's facts that are the same for every batch of a run (rollout layers, flow scale, ...).
        info: a run's JSON-able facts for settings.json (parameters, conventions, artifact tokens, notes); None for
            a batch.
    """

    arrays: dict[str, np.ndarray]
    input_images: list[Image.Image]
    layout: TokenLayout
    facts: dict[str, list] = field(default_factory=dict)
    run_facts: dict = field(default_factory=dict)
    info: dict | None = None


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
    """Capture B RGB images and run every analysis on the result, all in memory.

    The same per-batch steps as the CLI's streamed ``analyze`` (:func:`analyze_batch`), concatenated.
    """
    run = AnalysisRun(loaded, settings)
    parts = []
    for i in range(0, len(images), settings.batch_size):
        part = analyze_batch(loaded, images[i:i + settings.batch_size], settings)
        run.add(part)
        parts.append(part)
    arrays = {name: np.concatenate([p.arrays[name] for p in parts]) for name in parts[0].arrays}
    arrays |= run.final_arrays()
    return Analysis(arrays=arrays, info=run.info(), input_images=[im for p in parts for im in p.input_images],
                    layout=run.layout)


def analyze_batch(loaded: LoadedModel, images: list[Image.Image], settings: AnalysisSettings,
                  keep_attention: bool = True, edit=None, layout: TokenLayout | None = None) -> Analysis:
    """One forward for b images (b <= settings.batch_size) and every per-image analysis of it.

    Nothing is kept across batches, so a run's memory does not grow with its image count. The
    analyses run where the model ran (a GPU's attention stays there); ``keep_attention=False``
    leaves the raw (b, L, H, N, N) attention out of ``arrays``, and then it never reaches the host
    (flow and faithfulness copy one image's at a time). ``edit``, ``layout``: a repair run in the forward
    and the gradient rollout, and the token layout it makes (:mod:`vitviz.analyses.registers`).
    """
    trace = analysis_trace(Lens(loaded), preprocess(images, loaded.data_config), edit=edit, layout=layout)
    return analyze_trace(loaded, trace, settings, keep_attention, edit)


def analyze_trace(loaded: LoadedModel, trace: Trace, settings: AnalysisSettings, keep_attention: bool = True,
                  edit=None) -> Analysis:
    """Every per-image analysis of a batch's trace (the points :func:`vitviz.trace.analysis_points`, with its
    ``inputs``), as :func:`analyze_batch` runs them; ``edit``: the edit the trace's forward ran (a repair), which
    the analyses that run the model again (gradient rollout) run too."""
    batch, layout = trace.inputs, trace.layout
    attention = trace.stack("attn")
    # Every per-image reduction of the batch in one pass over its attention, where the model ran; only results
    # (and the attention itself when it is kept) come to the host.
    reduced = reduce_attention(attention, layout, fusion=settings.fusion)
    norms = to_host(trace.stack("resid_post.norm"))
    arrays = {"input": batch.tensor.numpy(), "features": to_host(trace["final_norm"].float()), "token_norms": norms}
    if keep_attention:
        arrays["attention"] = to_host(attention)
    facts: dict[str, list] = {}
    run_facts: dict = {}
    if trace.logits is not None:
        arrays["logits"] = to_host(trace.logits.float())
    if settings.clusters is not None:
        arrays["clusters"], facts["inertia_per_image"] = batch_clusters(
            loaded.model, batch.tensor, arrays["features"], layout, settings.clusters, settings.cluster_layer,
            settings.batch_size)

    artifacts, sinks = batch_artifacts(norms, layout), batch_sinks(reduced.received, layout)
    excluded = [excluded_tokens(settings, art, sink, layout) for art, sink in zip(artifacts, sinks)]
    rows = batch_rollout(reduced.fused, layout, discard=settings.discard, start=settings.start_layer,
                         end=settings.end_layer, exclude_tokens=excluded)
    rollouts = batch_rollouts(rows, layout, settings.start_layer)
    arrays["rollout"] = np.stack([r.map for r in rollouts])
    arrays["rollout_per_layer"] = np.stack([r.per_layer for r in rollouts])
    arrays["mean_distance_per_image"] = to_host(reduced.distance)
    facts["artifact_tokens"] = [a.tolist() for a in artifacts]
    facts["attention_sinks_per_layer"] = [[s.tolist() for s in sink.sinks] for sink in sinks]
    facts["prefix_share"] = [r.prefix_share for r in rollouts]
    run_facts["rollout"] = {"layers": list(rollouts[0].layers), "readout": rollouts[0].readout}
    if loaded.has_head:
        arrays["gradient_rollout"], facts["gradient_rollout_targets"] = batch_gradient_rollout(
            loaded.model, batch.tensor, layout, settings.target_class, edit=edit)
    if settings.flow:
        flows = [attention_flow(to_host(a), layout, fusion=settings.fusion, discard=settings.discard,
                                start=settings.start_layer, end=settings.end_layer, exclude_tokens=ex)
                 for a, ex in zip(attention, excluded)]
        arrays["attention_flow"] = np.stack([f.map for f in flows])
        facts["flow_error_bound"] = [float(f.error_bound.max()) for f in flows]
        run_facts["attention_flow"] = {"layers": list(flows[0].layers), "readout": flows[0].readout,
                                       "capacity_scale": flows[0].scale, "definition": FLOW_DEFINITION}
    if settings.attribution:
        attribution_arrays(loaded, batch.tensor, settings, arrays, facts)
    if settings.faithfulness:
        results = faithfulness_curves(loaded, batch.tensor, attention, arrays, layout, settings)
        arrays["deletion"] = np.stack([r.deletion for r in results])
        arrays["insertion"] = np.stack([r.insertion for r in results])
        facts["score"] = [r.score for r in results]
        facts["target_class"] = [r.target for r in results]
        facts["auc"] = [{m: {"deletion": float(d), "insertion": float(s)}
                         for m, d, s in zip(r.methods, r.deletion_auc, r.insertion_auc)} for r in results]
        facts["reference"] = [r.reference() for r in results]
        run_facts["faithfulness"] = {"methods": results[0].methods, "patches_per_step": results[0].counts.tolist()}
    return Analysis(arrays=arrays, facts=facts, run_facts=run_facts, input_images=batch.images, layout=layout)


def _written_settings(settings: AnalysisSettings) -> dict:
    """The settings as settings.json writes them: layers 1-based, and the keys say so (the dataclass counts from 0)."""
    written = asdict(settings)
    start, end, cluster = (written.pop(k) for k in ("start_layer", "end_layer", "cluster_layer"))
    return written | {"start_layer (1-based)": start + 1,
                      "end_layer (1-based, inclusive; null: the last)": end,  # [start, end) 0-based = [start+1, end]
                      "cluster_layer (1-based; null: the final features)": None if cluster is None else cluster + 1}


def _with_1based_layers(facts: dict) -> dict:
    """A run fact's 0-based layer range [start, end) as settings.json writes it: 1-based, first and last inclusive."""
    start, end = facts["layers"]
    return {"layers (1-based, inclusive)": [start + 1, end]} | {k: v for k, v in facts.items() if k != "layers"}


def attribution_arrays(loaded: LoadedModel, inputs: torch.Tensor, settings: AnalysisSettings, arrays: dict,
                       facts: dict) -> None:
    """``attribution_<method>`` (b, gh, gw); for relevance methods ``attribution_<method>_pixels`` (b, H, W); where a
    method read a coarser grid (Grad-CAM on a later Swin stage) ``attribution_<method>_coarse`` (b, gh', gw')."""
    from ..explainers.targets import default_target
    from ..explainers import explain

    target, lens = default_target(loaded.model, settings.target_class), Lens(loaded)
    explained = None
    for method in settings.attribution:
        result = explain(lens, inputs, method, target)
        explained = result if result.target is not None else explained
        key = "attribution_" + method.replace("-", "_")
        arrays[key] = result.patches.astype(np.float32)
        if result.pixels is not None:
            arrays[key + "_pixels"] = result.pixels.astype(np.float32)
            facts[f"attribution_conservation_{method}"] = result.conservation()
        if result.coarse is not None:
            arrays[key + "_coarse"] = result.coarse.astype(np.float32)
    if explained is None:  # gradient rollout alone: the class logit it explains, as its settings state it
        facts["attribution_target"] = [result.settings["target"]]
        facts["attribution_target_value"] = []
        return
    facts["attribution_target"] = [explained.target.describe()]  # one per batch (its classes per image)
    facts["attribution_target_value"] = explained.target_value.tolist()


def faithfulness_curves(loaded: LoadedModel, inputs: torch.Tensor, attention: torch.Tensor,
                        arrays: dict[str, np.ndarray], layout: TokenLayout, settings: AnalysisSettings) -> list:
    """Deletion/insertion curves (vitviz.perturbation.curves) of every map in one batch's ``arrays``, one result per image.

    attention: the batch's (b, L, H, N, N), on any device.
    """
    fractions = default_fractions(settings.faithfulness_steps)
    results = []
    for i in range(len(inputs)):
        maps = attention_maps(to_host(attention[i]), layout, rollout_map=arrays["rollout"][i],
                              gradient_map=arrays["gradient_rollout"][i] if "gradient_rollout" in arrays else None,
                              flow_map=arrays["attention_flow"][i] if "attention_flow" in arrays else None)
        results.append(perturbation_curves(loaded.model, inputs[i], maps, layout, fractions=fractions,
                                           target=settings.target_class, batch_size=settings.batch_size))
    return results


class AnalysisRun:
    """What the batches of one run add up to: the run-wide arrays and the facts for settings.json.

    Args:
        loaded: the model.
        settings: the analysis settings.
    """

    def __init__(self, loaded: LoadedModel, settings: AnalysisSettings):
        self.loaded, self.settings = loaded, settings
        self.facts: dict[str, list] = {}
        self.run_facts: dict = {}
        self.mean_distance: list[np.ndarray] = []
        self.layout: TokenLayout | None = None

    def add(self, batch: Analysis) -> None:
        """Keep the small per-image facts of one batch (never its arrays, but the (L, H) mean distances)."""
        self.layout = batch.layout
        self.run_facts = batch.run_facts
        for key, values in batch.facts.items():
            self.facts.setdefault(key, []).extend(values)
        self.mean_distance.extend(batch.arrays["mean_distance_per_image"])

    def final_arrays(self) -> dict[str, np.ndarray]:
        """Arrays known once every batch is in: mean_distance, and those of the model alone."""
        arrays = {"mean_distance": np.stack(self.mean_distance).mean(axis=0)}
        self.notes = []
        try:
            pca = patch_filter_pca(patch_filters(self.loaded.model))
            arrays["filter_pca"], arrays["filter_pca_explained"] = pca.components, pca.explained_variance_ratio
        except ValueError as exc:
            self.notes.append(str(exc))
        try:
            emb = patch_position_embeddings(self.loaded.model, self.layout)
            arrays["posembed_similarity"] = position_embedding_similarity(emb, self.layout.grid_size)
        except ValueError as exc:
            self.notes.append(str(exc))
        if self.settings.faithfulness:
            arrays["faithfulness_fractions"] = default_fractions(self.settings.faithfulness_steps)
        return arrays

    def info(self) -> dict:
        """JSON-able facts for settings.json (call after :meth:`final_arrays`)."""
        settings, facts, layout = self.settings, self.facts, self.layout
        info = {
            "settings": _written_settings(settings),
            "token_layout": layout.to_dict(),
            "artifact_tokens": facts["artifact_tokens"],
            "attention_sinks_per_layer": facts["attention_sinks_per_layer"],
            "attention_sinks_indexing": "per image, one list per layer (the first is layer 1); token indices 0-based "
                                        "into the sequence (prefix tokens first)",
            "rollout": _with_1based_layers(self.run_facts["rollout"]) | {
                "prefix_share": facts["prefix_share"],
                "definition": "per layer: fuse heads, discard lowest fraction (never the readout column), "
                              "0.5 A + 0.5 I, rows renormalised; R = A'_end ... A'_start"},
            "mean_distance_convention": DISTANCE_CONVENTION,
            "notes": list(self.notes),
        }
        if settings.clusters is not None:
            info["clusters"] = {
                "k": settings.clusters, "inertia_per_image": facts["inertia_per_image"],
                "layer (1-based)": "final features" if settings.cluster_layer is None else settings.cluster_layer + 1,
                "features": "final-norm patch tokens (npz 'features')" if settings.cluster_layer is None
                else "patch tokens leaving that block, before the final norm",
                "method": "k-means per image (scikit-learn, k-means++, 10 inits, seed 0), "
                          "labels 0..K-1 by cluster size, largest first"}
        if self.loaded.has_head:
            info["gradient_rollout_targets"] = facts["gradient_rollout_targets"]
        else:
            info["notes"].append("Gradient rollout needs a classifier head; this model has none.")
        if settings.attribution:
            info["attribution"] = attribution_info(settings.attribution, facts)
        if settings.flow:
            info["attention_flow"] = _with_1based_layers(self.run_facts["attention_flow"]) | {
                "max_error_bound": max(facts["flow_error_bound"])}
        if settings.faithfulness:
            info["faithfulness"] = {
                "protocol": protocol_text("mean"), "methods": self.run_facts["faithfulness"]["methods"],
                "method_maps": "rollout, gradient_rollout, attention_flow: the npz arrays of those names; "
                               "last_layer_*: the readout's raw attention in the last layer (heads 1-based); "
                               "random: uniform noise, numpy default_rng(0)",
                "score": facts["score"], "target_class": facts["target_class"],
                "patches_per_step": self.run_facts["faithfulness"]["patches_per_step"],
                "auc": facts["auc"], "reference": facts["reference"]}
        return info


def attribution_info(methods: tuple[str, ...], facts: dict) -> dict:
    """settings.json's ``analysis.attribution``: the methods, the target and how much of it reached the pixels."""
    from ..explainers import get_method

    target = dict(facts["attribution_target"][0])
    classes = [c for t in facts["attribution_target"] for c in t.get("classes", [])]
    if classes:
        target["classes"] = classes
    return {
        "methods": {m: get_method(m).label for m in methods},
        "target": target,
        "target_value": facts["attribution_target_value"],
        "conservation": {m: facts[f"attribution_conservation_{m}"] for m in methods
                         if f"attribution_conservation_{m}" in facts},
        "definition": "relevance methods: sum over colour channels of input (the npz's normalised input) x modified "
                      "gradient; patch map = sum per patch. LeGrad: min-max scaled per image, last two layers. "
                      "Grad-CAM: last block's ln1, ReLU, not rescaled. Window attention (Swin): LeGrad differentiates "
                      "the target itself through each block's window attention; Grad-CAM reads the last stage's grid "
                      "(attribution_gradcam_coarse) and is brought to the patches bilinearly",
    }
