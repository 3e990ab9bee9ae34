"""One image's perturbation test as the Faithfulness page runs it, in one place: the Faithfulness page and the
Registers' "before and after" both call :func:`image_faithfulness`, so the "before" rows are the Faithfulness page's
own numbers, from its own cache entry (a user who ran that page first waits only for the "after")."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitviz.analyses.flow import attention_flow
from vitviz.analyses.rollout import FUSIONS
from vitviz.explainers import explain, names as explainer_names
from vitviz.explainers.targets import default_target
from vitviz.perturbation.curves import (RANDOM_SEEDS, Faithfulness, attention_maps, default_fractions, ordered,
                                        random_seed_maps)
from vitviz.perturbation.protocols import PROTOCOLS, protocol_curves
from vitviz.runs.analysis import AnalysisSettings
from vitviz.runs.faithfulness_run import DEFAULT_METHODS
from vitviz.sources.preprocess import preprocess

from .cache import cached_gradient_rollout, cached_rollout, model_run
from .progress import with_progress


@dataclass(frozen=True)
class FaithfulnessSettings:
    """What decides one image's perturbation curves (the Faithfulness page's controls).

    Attributes:
        methods: the page's method names (``random`` stands for :data:`RANDOM_SEEDS` seeded maps from ``seed``).
        steps: fractions 0, 1/(steps-1), ..., 1. target: the class scored and explained (None: headless).
        fusion, discard, start, end: rollout's head fusion, discarded share and layers (0-based, end exclusive).
        flow_start, flow_end: attention flow's layers (0-based, end exclusive).
        seed: the first random seed. ordering: how signed maps order the patches. replacement: ``mean`` or ``blur``.
    """

    methods: tuple[str, ...]
    steps: int
    target: int | None
    fusion: str
    discard: float
    start: int
    end: int
    flow_start: int
    flow_end: int
    seed: int = 0
    ordering: str = "signed"
    replacement: str = "mean"

    @classmethod
    def defaults(cls, ctx, methods: tuple[str, ...] | None = None) -> "FaithfulnessSettings":
        """The page's settings as it opens: :data:`DEFAULT_METHODS` where the model allows them, 11 steps, the top-1
        class (a model with a head), rollout and flow over every layer with mean fusion, seed 0, signed order, mean
        replacement."""
        L = ctx.result.attention.shape[0]
        target = int(np.asarray(ctx.result.logits).argmax()) if ctx.loaded.has_head else None
        return cls(methods=tuple(m for m in (methods or DEFAULT_METHODS) if m in method_options(ctx)), steps=11,
                   target=target, fusion=FUSIONS[0], discard=0.0, start=0, end=L, flow_start=0, flow_end=L)

    def forwards(self) -> int:
        """Model forwards of the test: every map under every protocol at each inner step, and the two ends."""
        maps = len(self.methods) + (RANDOM_SEEDS - 1 if "random" in self.methods else 0)
        return maps * len(PROTOCOLS) * (self.steps - 2) + 2


def attribution_options(lens) -> list[str]:
    """The registry's methods that explain a target and apply to this model (relevance, occlusion); gradient rollout
    is listed with the attention methods."""
    return [m for m in explainer_names(lens, kinds=("relevance", "perturbation")) if m != "gradient_rollout"]


def method_options(ctx) -> list[str]:
    """Every method the page offers for this model, in its order."""
    H = ctx.result.attention.shape[1]
    return (["last_layer_mean"] + [f"last_layer_head_{h + 1}" for h in range(H)] + ["rollout"]
            + (["gradient_rollout"] if ctx.loaded.has_head else []) + ["attention_flow"]
            + attribution_options(ctx.lens) + ["random"])


def faithfulness_key(ctx, s: FaithfulnessSettings) -> tuple:
    """The cache entry of one image's test under ``s`` (shared by every page that asks for it)."""
    return ("faithfulness", ctx.spec, ctx.image.sha256, tuple(s.methods), s.steps, s.target, s.fusion, s.discard,
            s.start, s.end, s.flow_start, s.flow_end, s.seed, s.ordering, s.replacement)


def flow_map(ctx, s: FaithfulnessSettings):
    """Attention flow of the readout over ``s``'s flow layers (cached, with its own progress bar)."""
    key = ("flow", ctx.spec, ctx.image.sha256, s.fusion, s.discard, s.flow_start, s.flow_end)
    return with_progress(key, f"Attention flow, layers {s.flow_start + 1}–{s.flow_end}: patch",
                         lambda progress: attention_flow(ctx.result.attention, ctx.result.layout, fusion=s.fusion,
                                                         discard=s.discard, start=s.flow_start, end=s.flow_end,
                                                         progress=progress))


def _run(ctx, s: FaithfulnessSettings, progress) -> tuple[Faithfulness, np.ndarray]:
    r, layout, loaded = ctx.result, ctx.result.layout, ctx.loaded
    model_input = preprocess([ctx.image.image], loaded.data_config).tensor[0]
    roll = cached_rollout(ctx.spec, ctx.image.sha256, r, AnalysisSettings(fusion=s.fusion, discard=s.discard,
                                                                          start_layer=s.start, end_layer=s.end))
    grad = cached_gradient_rollout(ctx.spec, ctx.image.sha256, ctx.image.image, s.target)[0] \
        if "gradient_rollout" in s.methods else None
    flow = flow_map(ctx, s).map if "attention_flow" in s.methods else None
    maps = attention_maps(r.attention, layout, rollout_map=roll.map, gradient_map=grad, flow_map=flow, seed=s.seed)
    attributions = attribution_options(ctx.lens)
    model = ctx.lens.model
    chosen = {}
    with model_run():
        for m in s.methods:
            if m == "random":
                chosen |= random_seed_maps(layout.grid_size, s.seed)
            elif m in attributions:
                found = explain(ctx.lens, model_input[None], m, default_target(model, s.target))
                chosen[m] = ordered(found.patches[0], s.ordering) if found.signed else found.patches[0]
            else:
                chosen[m] = maps[m]
        curves = protocol_curves(model, model_input, chosen, layout, protocols=PROTOCOLS, replacement=s.replacement,
                                 fractions=default_fractions(s.steps), target=s.target, progress=progress)
    # MoRF is the deletion curve; LeRF goes beside it for the LXT summary (AUC LeRF - MoRF).
    return curves.faithfulness(chosen, layout.num_patches), curves.curves["lerf"]


def image_faithfulness(ctx, s: FaithfulnessSettings) -> tuple[Faithfulness, np.ndarray]:
    """The current image's curves under ``s`` (every ``random_seed_*`` map its own row) and its LeRF curves (M, S):
    computed once per image and settings with a progress bar, then kept for every session."""
    return with_progress(faithfulness_key(ctx, s), "Perturbation test: method", lambda progress: _run(ctx, s, progress))
