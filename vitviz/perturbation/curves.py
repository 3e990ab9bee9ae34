"""Which map to trust: deletion and insertion curves for attribution maps (Petsiuk et al. 2018, RISE).

The protocol (the tests pin it; the app, CLI and settings.json state it):

- Units are patches. A map over the patch grid orders the patches by descending value; ties go to
  the lower raster index first (a stable sort of the negated map).
- Fractions f (default 0, 0.1, ..., 1.0). At step f, k = round(f * P) patches, rounding halves up.
- Deletion: the first k patches are set to 0 in the *normalised* model input (the dataset mean
  colour). Insertion: start from the all-zero input and put back only the first k patches.
- Score: for a model with a classifier head, the softmax probability of the target class (default
  the unperturbed top-1); for a headless model, the cosine similarity between the pre-logits vector
  (the adapter's ``pooled`` point: timm ``forward_head(forward_features(x), pre_logits=True)``;
  transformers: the family's pooled vector) of the perturbed and of the original input.
- AUC by the trapezoid rule over f. Lower deletion AUC and higher insertion AUC = more faithful.

The perturbed inputs of one image and method go through the model's own forward in batches;
the two inputs every method shares (the original and the all-zero input) are scored once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from PIL import Image

from ..adapters import adapter_for
from ..errors import OptionError
from ..trace import trace_model
from ..layout import TokenLayout
from ..analyses.maps import query_attention_map

MODES = ("deletion", "insertion")
# The protocol in words, around the replacement chosen: :func:`vitviz.perturbation.protocols.protocol_text`.
PROTOCOL_ORDER = ("patches ordered by descending map value, ties to the lower raster index (stable sort); "
                  "k = round(f * P) patches at fraction f (halves up)")
PROTOCOL_AUC = "AUC by the trapezoid rule over f; lower deletion AUC and higher insertion AUC = more faithful"


def default_fractions(steps: int = 11) -> np.ndarray:
    """``steps`` evenly spaced fractions from 0 to 1: (steps,)."""
    if steps < 2:
        raise OptionError(f"the perturbation curve needs at least 2 steps, not {steps}")
    return np.linspace(0.0, 1.0, steps)


def patch_order(grid_map: np.ndarray) -> np.ndarray:
    """Patch indices (raster order) by descending value, ties to the lower index: (gh, gw) -> (P,)."""
    return np.argsort(-np.asarray(grid_map, dtype=np.float64).ravel(), kind="stable")


def step_counts(fractions: np.ndarray, num_patches: int) -> np.ndarray:
    """k = round(f * P) with halves rounded up (not to even): (S,) -> (S,) int."""
    f = np.asarray(fractions, dtype=np.float64)
    if f.ndim != 1 or (f < 0).any() or (f > 1).any() or (np.diff(f) <= 0).any():
        raise OptionError("perturbation fractions must increase strictly within [0, 1]")
    return np.floor(f * num_patches + 0.5 + 1e-9).astype(int)


def patch_masks(order: np.ndarray, counts: np.ndarray, grid_size: tuple[int, int]) -> np.ndarray:
    """(S, gh, gw) bool: at step s the first ``counts[s]`` patches of ``order``."""
    rank = np.empty(len(order), dtype=int)
    rank[order] = np.arange(len(order))
    return (rank[None, :] < np.asarray(counts)[:, None]).reshape(len(counts), *grid_size)


def pixel_masks(masks: np.ndarray, layout: TokenLayout, input_hw: tuple[int, int]) -> np.ndarray:
    """Patch masks (S, gh, gw) -> pixel masks (S, H, W); pixels outside the patch grid are never selected."""
    ph, pw = layout.patch_size
    up = masks.repeat(ph, axis=1).repeat(pw, axis=2)
    out = np.zeros((len(masks), *input_hw), dtype=bool)
    h, w = min(up.shape[1], input_hw[0]), min(up.shape[2], input_hw[1])
    out[:, :h, :w] = up[:, :h, :w]
    return out


def perturb(image: torch.Tensor, masks: np.ndarray, mode: str) -> torch.Tensor:
    """Perturbed copies of one normalised input.

    Args:
        image: (3, H, W) normalised model input.
        masks: (S, H, W) bool, the selected pixels at each step.
        mode: ``"deletion"`` (selected pixels set to 0) or ``"insertion"`` (only selected pixels kept).

    Returns:
        (S, 3, H, W).
    """
    if mode not in MODES:
        raise OptionError(f"perturbation mode must be one of {MODES}, not {mode!r}")
    keep = torch.from_numpy(~masks if mode == "deletion" else masks).to(image.device)
    return image[None] * keep[:, None].to(image.dtype)


def read_point(model, x: torch.Tensor, point: str) -> torch.Tensor:
    """One model-level point (``"logits"`` (B, C) or ``"pooled"`` (B, D)) of a batch (B, 3, H, W), the one forward
    every score here runs: fused where the family has a fused path (nothing inside the blocks is read).

    Not :meth:`vitviz.Lens.trace`: a Lens reads the model's token layout, and a score reads only the model's output,
    so any model an adapter runs can be scored, one without a patch grid too.
    """
    return trace_model(model, x, keep=(point,), fast=True, grad=None)[point]


class Score:
    """What a perturbed input is scored by. Subclasses set ``name`` and either ``point`` (the model point read:
    ``"logits"`` or ``"pooled"``) with :meth:`of` (that point's rows -> scores; rows of different images and scores
    then share forwards, :func:`vitviz.perturbation.protocols.protocol_curves_batch`), or ``__call__``."""

    name = ""
    point: str | None = None

    def describe(self) -> str:
        return self.name

    def of(self, values: torch.Tensor) -> np.ndarray:
        """(B, …) values of :attr:`point` -> (B,) scores."""
        raise NotImplementedError

    def __call__(self, model, x: torch.Tensor) -> np.ndarray:  # (B, 3, H, W) -> (B,)
        return self.of(read_point(model, x, self.point))


class ClassProbability(Score):
    """Softmax probability of one class (models with a classifier head)."""

    name = "class probability"
    point = "logits"

    def __init__(self, target: int):
        self.target = int(target)

    def describe(self) -> str:
        return f"softmax probability of class {self.target}"

    def of(self, values):
        return values.float().softmax(dim=-1)[:, self.target].double().cpu().numpy()


def model_logits(model, x: torch.Tensor) -> torch.Tensor:
    """The classifier's logits of the model's forward (its adapter's): (B, 3, H, W) -> (B, C)."""
    return read_point(model, x, "logits")


def pre_logits(model, x: torch.Tensor) -> torch.Tensor:
    """The pooled vector the head reads (the adapter's ``pooled`` point): (B, 3, H, W) -> (B, D)."""
    return read_point(model, x, "pooled")


def pre_logits_text(model) -> str:
    """The pre-logits vector in words."""
    return adapter_for(model).pooled_text(model)


class PreLogitsCosine(Score):
    """Cosine similarity of the pre-logits vector with that of the original input (headless models)."""

    name = "pre-logits cosine"
    point = "pooled"

    def __init__(self, reference: torch.Tensor, vector: str = "forward_head(pre_logits=True)"):
        self.reference = reference.float().reshape(1, -1)
        self.vector = vector

    def describe(self) -> str:
        return f"cosine similarity of the pre-logits vector ({self.vector}) with the original's"

    def of(self, values):
        return torch.nn.functional.cosine_similarity(values.float(), self.reference.to(values.device),
                                                     dim=-1).double().cpu().numpy()


@torch.inference_mode()
def default_score(model, image: torch.Tensor, target: int | None = None) -> Score:
    """The protocol's score for this model and one normalised image (3, H, W): class probability
    of ``target`` (default the top-1) with a head, else the pre-logits cosine."""
    x = _to_model(model, image[None])
    if adapter_for(model).num_classes(model) > 0:
        return ClassProbability(int(model_logits(model, x)[0].argmax()) if target is None else target)
    return PreLogitsCosine(pre_logits(model, x)[0], pre_logits_text(model))


def _to_model(model, x: torch.Tensor) -> torch.Tensor:
    param = next(model.parameters())
    return x.to(device=param.device, dtype=param.dtype)


@torch.inference_mode()
def score_inputs(model, inputs: torch.Tensor, score: Score, batch_size: int = 16) -> np.ndarray:
    """The score of every input, ``batch_size`` per forward: (S, 3, H, W) -> (S,)."""
    return np.concatenate([score(model, _to_model(model, inputs[i:i + batch_size]))
                           for i in range(0, len(inputs), batch_size)])


def auc(curve: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Trapezoid rule over the fractions: (..., S) -> (...)."""
    y, f = np.asarray(curve, dtype=np.float64), np.asarray(fractions, dtype=np.float64)
    return ((y[..., 1:] + y[..., :-1]) / 2 * np.diff(f)).sum(axis=-1)


@dataclass
class Faithfulness:
    """Deletion and insertion curves of M maps on one image.

    Attributes:
        methods: M method names.
        maps: (M, gh, gw) the maps as given.
        fractions: (S,) fractions of patches; counts: (S,) patches perturbed at each step.
        deletion, insertion: (M, S) scores.
        score: the score used, in words; target: its class (None for the pre-logits cosine).
    """

    methods: list[str]
    maps: np.ndarray
    fractions: np.ndarray
    counts: np.ndarray
    deletion: np.ndarray
    insertion: np.ndarray
    score: str
    target: int | None = None

    @property
    def deletion_auc(self) -> np.ndarray:
        return auc(self.deletion, self.fractions)

    @property
    def insertion_auc(self) -> np.ndarray:
        return auc(self.insertion, self.fractions)

    def table(self, chance: ChanceBand | None = None) -> list[dict]:
        """One row per method: AUCs, their difference, and which method is best/worst per metric.

        With ``chance`` (the random maps' band on this image), a "best" that :meth:`ChanceBand.compare` cannot tell
        from chance (or finds worse) says so beside it: "best insertion (within chance)"."""
        d, i = self.deletion_auc, self.insertion_auc
        rows = []
        for m, name in enumerate(self.methods):
            marks = [label + qualify_best(chance, protocol, value) if label.startswith("best") else label
                     for label, hit, protocol, value in (
                         ("best deletion", d[m] == d.min(), "deletion", d[m]),
                         ("worst deletion", d[m] == d.max(), "deletion", d[m]),
                         ("best insertion", i[m] == i.max(), "insertion", i[m]),
                         ("worst insertion", i[m] == i.min(), "insertion", i[m])) if hit]
            rows.append({"method": name, "deletion_auc": float(d[m]), "insertion_auc": float(i[m]),
                         "insertion_minus_deletion": float(i[m] - d[m]), "reference": ", ".join(marks)})
        return rows

    def reference(self) -> dict:
        """The best and worst method per metric (lowest/highest deletion AUC, highest/lowest insertion AUC)."""
        d, i = self.deletion_auc, self.insertion_auc
        return {"best": {"deletion": self.methods[int(d.argmin())], "insertion": self.methods[int(i.argmax())]},
                "worst": {"deletion": self.methods[int(d.argmax())], "insertion": self.methods[int(i.argmin())]}}


def perturbation_curves(model, image: torch.Tensor, maps: dict[str, np.ndarray], layout: TokenLayout, *,
                        fractions: np.ndarray | None = None, score: Score | None = None, target: int | None = None,
                        batch_size: int = 16, progress: Callable[[int, int], None] | None = None) -> Faithfulness:
    """Deletion and insertion curves of every map on one image.

    Args:
        model: a timm ViT or a transformers model from :func:`vitviz.sources.hf.load`, in eval mode (its own forward
            is used).
        image: (3, H, W) normalised model input.
        maps: method name -> (gh, gw) map over the patch grid.
        layout: token layout (grid and patch size).
        fractions: (S,) increasing in [0, 1]; default 0, 0.1, ..., 1.
        score: what to score; default :func:`default_score` (with ``target`` for head models).
        batch_size: perturbed inputs per forward.
        progress: called with (methods done, methods).

    Returns:
        Faithfulness with (M, S) deletion and insertion curves.
    """
    fractions = default_fractions() if fractions is None else np.asarray(fractions, dtype=np.float64)
    counts = step_counts(fractions, layout.num_patches)
    score = default_score(model, image, target) if score is None else score
    # The original and the all-zero input are the same for every method: score them once.
    original, blank = score_inputs(model, torch.stack([image, torch.zeros_like(image)]), score)
    interior = (counts > 0) & (counts < layout.num_patches)
    names = list(maps)
    curves = {mode: np.empty((len(names), len(counts))) for mode in MODES}
    for m, name in enumerate(names):
        order = patch_order(maps[name])
        pixels = pixel_masks(patch_masks(order, counts[interior], layout.grid_size), layout, tuple(image.shape[-2:]))
        inputs = torch.cat([perturb(image, pixels, mode) for mode in MODES])
        scores = score_inputs(model, inputs, score, batch_size).reshape(2, -1)
        for mode, s, at_zero, at_all in zip(MODES, scores, (original, blank), (blank, original)):
            curves[mode][m] = np.where(counts == 0, at_zero, at_all)
            curves[mode][m, interior] = s
        if progress is not None:
            progress(m + 1, len(names))
    return Faithfulness(methods=names, maps=np.stack([np.asarray(maps[n], dtype=np.float64) for n in names]),
                        fractions=fractions, counts=counts, deletion=curves["deletion"],
                        insertion=curves["insertion"], score=score.describe(),
                        target=getattr(score, "target", None))


def random_map(grid_size: tuple[int, int], seed: int = 0) -> np.ndarray:
    """The floor: a seeded uniform random map (gh, gw)."""
    return np.random.default_rng(seed).random(grid_size)


def readout_query(layout: TokenLayout) -> str:
    """The readout's row of raw attention: the CLS query, or the mean over patch queries."""
    return "cls" if layout.has_class_token else "mean"


def attention_maps(attention: np.ndarray, layout: TokenLayout, *, rollout_map: np.ndarray,
                   flow_map: np.ndarray | None = None, gradient_map: np.ndarray | None = None,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """The compared methods' maps for one image, in the protocol's order.

    Names: ``last_layer_mean`` (raw readout attention, mean over heads), ``last_layer_head_1`` ...
    (1-based), ``rollout``, ``gradient_rollout`` and ``attention_flow`` (when given), ``random``.
    attention: (L, H, N, N); maps (gh, gw).
    """
    query = readout_query(layout)
    heads = np.stack([query_attention_map(attention, layout, -1, h, query) for h in range(attention.shape[1])])
    maps = {"last_layer_mean": heads.mean(axis=0)}
    maps |= {f"last_layer_head_{h + 1}": m for h, m in enumerate(heads)}
    maps["rollout"] = rollout_map
    if gradient_map is not None:
        maps["gradient_rollout"] = gradient_map
    if flow_map is not None:
        maps["attention_flow"] = flow_map
    maps["random"] = random_map(layout.grid_size, seed)
    return maps


def to_rgb(inputs: torch.Tensor, data_config: dict) -> list[Image.Image]:
    """Normalised inputs back to 8-bit RGB, what the model saw: (S, 3, H, W) -> S images."""
    mean = torch.tensor(data_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(data_config["std"]).view(1, 3, 1, 1)
    x = (inputs.detach().float().cpu() * std + mean).clamp(0, 1)
    arr = (x.permute(0, 2, 3, 1).numpy() * 255 + 0.5).astype(np.uint8)
    return [Image.fromarray(a) for a in arr]


def perturbed_at(image: torch.Tensor, grid_map: np.ndarray, layout: TokenLayout, fraction: float) -> dict[str, torch.Tensor]:
    """The deletion and insertion inputs of one map at one fraction: mode -> (3, H, W)."""
    counts = step_counts(np.array([fraction]), layout.num_patches)
    pixels = pixel_masks(patch_masks(patch_order(grid_map), counts, layout.grid_size), layout, tuple(image.shape[-2:]))
    return {mode: perturb(image, pixels, mode)[0] for mode in MODES}


# ---------------------------------------------------------------------------------------------
# Honest statistics: the random floor over several seeds, and how a signed map is ordered

RANDOM_SEEDS = 10
ORDERINGS = ("signed", "positive", "absolute")
SEED_PREFIX = "random_seed_"


def ordered(grid_map: np.ndarray, ordering: str = "signed") -> np.ndarray:
    """The map whose descending order is the perturbation order: ``signed`` (as is: most positive first,
    most negative last), ``positive`` (negative values tie at 0) or ``absolute`` (|value|)."""
    if ordering == "signed":
        return grid_map
    if ordering == "positive":
        return np.maximum(grid_map, 0)
    if ordering == "absolute":
        return np.abs(grid_map)
    raise OptionError(f"unknown ordering {ordering!r}: choose from {', '.join(ORDERINGS)}")


def random_seed_maps(grid_size: tuple[int, int], first_seed: int = 0, seeds: int = RANDOM_SEEDS) -> dict:
    """``random_seed_<s>`` -> the seeded random map, for seeds first_seed .. first_seed + seeds - 1."""
    return {f"{SEED_PREFIX}{s}": random_map(grid_size, s) for s in range(first_seed, first_seed + seeds)}


@dataclass
class ChanceBand:
    """The random maps' AUCs over seeds on one image: where chance lies, and how far it wanders.

    Attributes:
        deletion, insertion: (seeds,) AUC of each seed's random map.
    """

    deletion: np.ndarray
    insertion: np.ndarray

    @property
    def seeds(self) -> int:
        return len(self.deletion)

    def band(self, protocol: str) -> tuple[float, float]:
        """(mean, standard deviation over seeds, ddof=1) of ``"deletion"`` or ``"insertion"`` AUC."""
        values = getattr(self, protocol)
        return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0

    def compare(self, protocol: str, value: float) -> str:
        """``"better"``, ``"worse"`` or ``"chance"``: outside mean ± 2 s.d. of the seeds on the right side (lower
        deletion, higher insertion), on the wrong side, or inside the band."""
        mean, sd = self.band(protocol)
        if abs(value - mean) <= 2 * sd:
            return "chance"
        better = value < mean if protocol == "deletion" else value > mean
        return "better" if better else "worse"

    def sentence(self, name: str, deletion_auc: float, insertion_auc: float) -> str:
        """One plain sentence: can ``name`` be told from the random maps on this image?"""
        verdicts = {p: self.compare(p, v) for p, v in (("deletion", deletion_auc), ("insertion", insertion_auc))}
        spread = "; ".join(f"{p} {self.band(p)[0]:.3f} ± {self.band(p)[1]:.3f}" for p in verdicts)
        if all(v == "chance" for v in verdicts.values()):
            return (f"{name} cannot be told from chance on this image: its deletion AUC {deletion_auc:.3f} and "
                    f"insertion AUC {insertion_auc:.3f} lie within two standard deviations of the random maps' "
                    f"({spread}, mean ± s.d. over {self.seeds} seeds).")
        parts = [f"{'better than' if v == 'better' else 'worse than' if v == 'worse' else 'not distinguishable from'} "
                 f"chance on {p}" for p, v in verdicts.items()]
        return (f"{name} is {' and '.join(parts)} (deletion {deletion_auc:.3f}, insertion {insertion_auc:.3f}; "
                f"random maps {spread}, mean ± s.d. over {self.seeds} seeds; outside ± 2 s.d. counts).")


def qualify_best(chance: ChanceBand | None, protocol: str, value: float) -> str:
    """What follows "best" for a method whose AUC on ``protocol`` is ``value``: "" when it beats the random maps
    (or there is no band to ask), " (within chance)" or " (worse than chance)" otherwise, so a best that cannot be
    told from chance never reads as a finding."""
    verdict = "better" if chance is None else chance.compare(protocol, value)
    return {"better": "", "chance": " (within chance)", "worse": " (worse than chance)"}[verdict]


def split_random_seeds(result: Faithfulness) -> tuple[list[int], ChanceBand | None]:
    """The indices of ``result``'s non-random methods and the chance band of its ``random_seed_*`` maps (None
    without any)."""
    seeds = [m for m, name in enumerate(result.methods) if name.startswith(SEED_PREFIX)]
    others = [m for m in range(len(result.methods)) if m not in seeds]
    if not seeds:
        return others, None
    return others, ChanceBand(result.deletion_auc[seeds], result.insertion_auc[seeds])



@dataclass
class FoldedSeeds:
    """A run's curves with its ``random_seed_*`` rows folded into one ``"random"`` row, as a reader compares them.

    Attributes:
        result: the non-random methods in their order, then ``"random"`` (when there were seeds): its deletion and
            insertion curves the mean over the seeds, its map the first seed's.
        lerf: (M, S) the LeRF curves of ``result.methods``, folded alike.
        band: the seeds' chance band (None without seeds).
    """

    result: Faithfulness
    lerf: np.ndarray
    band: ChanceBand | None


def fold_random_seeds(full: Faithfulness, lerf: np.ndarray) -> FoldedSeeds:
    """Fold ``full``'s ``random_seed_*`` methods (and the matching rows of ``lerf``, (M, S) LeRF curves) into one
    ``"random"`` row: the mean curve over the seeds, the first seed's map; the seeds' spread becomes the band."""
    others, band = split_random_seeds(full)
    seeds = [m for m in range(len(full.methods)) if m not in others]
    rows = [*others, *seeds[:1]]

    def folded(curves: np.ndarray) -> np.ndarray:
        return np.concatenate([curves[others], curves[seeds].mean(0, keepdims=True)]) if seeds else curves[others]

    result = Faithfulness(methods=[full.methods[m] if m in others else "random" for m in rows], maps=full.maps[rows],
                          fractions=full.fractions, counts=full.counts, score=full.score, target=full.target,
                          deletion=folded(full.deletion), insertion=folded(full.insertion))
    return FoldedSeeds(result, folded(lerf), band)
