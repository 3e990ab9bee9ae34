"""Perturbation protocols a lab can put beside published tables.

One map orders the patches (:func:`vitviz.perturbation.curves.patch_order`: descending value, ties to the
lower raster index). At fraction f the first k = round(f * P) patches of an order (halves up) are
replaced by a *replacement* value, or are the only ones restored from it:

- ``morf`` (deletion, most relevant first): the top-k patches replaced; lower AUC = more faithful.
- ``lerf`` (least relevant first): the same with the order reversed (the last patch of MoRF's order
  goes first); higher AUC = more faithful. With one replacement, LeRF at f keeps exactly the patches
  insertion restores at 1 - f (up to one patch where f * P ends in .5), so the two AUCs agree: LeRF is
  kept because the LXT summary is phrased with it.
- ``insertion``: start from the replacement everywhere and restore the top-k patches; higher = better.
- ``lerf_minus_morf``: AUC(LeRF) - AUC(MoRF), the summary of the AttnLRP paper (Achtibat et al. 2024,
  "area between the perturbation curves"); higher = better.
- Chefer et al. CVPR'21 (classifiers only): ``positive`` (MoRF) and ``negative`` (LeRF) perturbation at
  fractions 0, 0.1, ..., 0.9, scored by top-1 agreement: 1 when the perturbed input's top-1 class is the
  label, else 0. Without ground truth the label is the model's top-1 on the unperturbed image (as here).
  The top-1 accuracy over a set is the mean of these over images; AUC = trapezoid over the fractions
  0..0.9 x 100 (so at most 90), per image, whose mean over images is the set's AUC (the trapezoid is
  linear). Lower positive AUC and higher negative AUC = more faithful.
  Checked against Chefer's code (hila-chefer/Transformer-Explainability,
  baselines/ViT/pertubation_eval_from_hdf5.py and generate_visualizations.py): the same order (positive:
  torch.topk of the map, most relevant removed first; negative: topk of the negated map, least relevant first)
  and the same fractions 0.1..0.9; it differs in what follows, so numbers sit beside the published tables only
  as a comparison of conventions, not of values:
  - Chefer sets the removed pixels to 0 in [0, 1] pixel space before normalising (black), vitviz uses the
    chosen replacement (the mean colour or a blurred copy);
  - Chefer ranks pixels of the patch map upsampled bilinearly x16 (min-max scaled) and removes int(f * 224²)
    pixels (partial patches); vitviz removes round(f * P) whole patches;
  - Chefer scores against ImageNet's ground-truth label, so the 0 % point (computed apart, as the model's
    accuracy) is below 1; here the label is the unperturbed top-1, so the 0 % point is 1 by construction;
  - Chefer's repository computes no AUC (it saves the accuracy per fraction): vitviz's trapezoid over
    0..0.9 x 100 is vitviz's own definition, and includes the 0 % point.

Replacement values: ``mean`` sets the pixels to 0 in the normalised input (the dataset mean colour);
``blur`` takes them from a Gaussian-blurred copy of the input (RISE's insertion baseline: an 11 x 11
kernel, sigma 5 px, edges replicated).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..errors import OptionError, ViewNotApplicable
from .curves import (PROTOCOL_AUC, PROTOCOL_ORDER, Faithfulness, Score, auc, default_fractions, default_score,
                     model_logits, patch_masks, patch_order, pixel_masks, score_inputs, step_counts, _to_model)
from ..trace import trace_model
from ..layout import TokenLayout

PROTOCOLS = ("morf", "lerf", "insertion")
CHEFER = ("positive", "negative")
SUMMARY = "lerf_minus_morf"
REPLACEMENTS = ("mean", "blur")
BLUR_KERNEL, BLUR_SIGMA = 11, 5.0
# Which way is more faithful, per protocol (and the summary): "lower" or "higher" AUC.
BETTER = {"morf": "lower", "lerf": "higher", "insertion": "higher", SUMMARY: "higher", "positive": "lower",
          "negative": "higher"}
LABELS = {"morf": "deletion (MoRF)", "lerf": "LeRF", "insertion": "insertion", SUMMARY: "LeRF − MoRF (LXT)",
          "positive": "positive perturbation (Chefer)", "negative": "negative perturbation (Chefer)"}
REPLACEMENT_TEXT = {"mean": "the dataset mean colour (0 in the normalised input)",
                    "blur": f"a Gaussian-blurred copy of the input (RISE: {BLUR_KERNEL}x{BLUR_KERNEL} kernel, "
                            f"sigma {BLUR_SIGMA:g} px, edges replicated)"}
CHEFER_TEXT = ("Chefer et al. CVPR'21: patches removed most relevant first (positive) or least relevant first "
               "(negative) at fractions 0..0.9; score 1 when the top-1 class stays the unperturbed image's top-1 "
               "(no ground truth), else 0; AUC = trapezoid over the fractions x 100 (at most 90). Unlike Chefer's "
               "code: whole patches (not pixels of the upsampled map) replaced by the chosen replacement (not "
               "black), and the 0 % point is 1 (not the model's accuracy against ground truth)")


def protocol_text(replacement: str) -> str:
    """The deletion/insertion protocol in words with the ``replacement`` chosen (:data:`REPLACEMENT_TEXT`)."""
    if replacement not in REPLACEMENT_TEXT:
        raise OptionError(f"unknown replacement {replacement!r}: choose from {', '.join(REPLACEMENTS)}")
    return (f"{PROTOCOL_ORDER}; deletion replaces them by {REPLACEMENT_TEXT[replacement]}, insertion starts from "
            f"that replacement everywhere and restores them; {PROTOCOL_AUC}")


def chefer_fractions() -> np.ndarray:
    """0, 0.1, ..., 0.9: (10,)."""
    return np.arange(10) / 10


def blurred(image: torch.Tensor) -> torch.Tensor:
    """RISE's blur of a normalised input (3, H, W): a separable Gaussian, :data:`BLUR_KERNEL` taps, sigma
    :data:`BLUR_SIGMA`, edges replicated (the blur of a constant is that constant)."""
    r = BLUR_KERNEL // 2
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    g = torch.exp(-t ** 2 / (2 * BLUR_SIGMA ** 2))
    g = (g / g.sum()).to(image.dtype).to(image.device)
    x = torch.nn.functional.pad(image[:, None], (r, r, r, r), mode="replicate")  # (3, 1, H+2r, W+2r)
    x = torch.nn.functional.conv2d(x, g.view(1, 1, 1, -1))
    x = torch.nn.functional.conv2d(x, g.view(1, 1, -1, 1))
    return x[:, 0]


def replacement_of(image: torch.Tensor, replacement: str) -> torch.Tensor:
    """What replaced patches become: (3, H, W) -> (3, H, W)."""
    if replacement == "mean":
        return torch.zeros_like(image)
    if replacement == "blur":
        return blurred(image)
    raise OptionError(f"unknown replacement {replacement!r}: choose from {', '.join(REPLACEMENTS)}")


def protocol_order(grid_map: np.ndarray, protocol: str) -> np.ndarray:
    """The patch order of ``protocol``: MoRF's (descending, ties to the lower index) or its exact reverse."""
    order = patch_order(grid_map)
    return order[::-1].copy() if protocol in ("lerf", "negative") else order


def protocol_inputs(image: torch.Tensor, base: torch.Tensor, order: np.ndarray, counts: np.ndarray,
                    layout: TokenLayout, protocol: str) -> torch.Tensor:
    """Perturbed copies (S, 3, H, W): the first ``counts[s]`` patches of ``order`` taken from ``base`` (removal
    protocols) or the only ones taken from ``image`` (insertion)."""
    masks = pixel_masks(patch_masks(order, counts, layout.grid_size), layout, tuple(image.shape[-2:]))
    sel = torch.from_numpy(masks).to(image.device)[:, None]
    if protocol == "insertion":
        return torch.where(sel, image[None], base[None])
    return torch.where(sel, base[None], image[None])


def step_inputs(image: torch.Tensor, grid_map: np.ndarray, count: int, layout: TokenLayout,
                replacement: str) -> torch.Tensor:
    """What the model sees at one step of a map's curves (2, 3, H, W): the deletion input (the map's ``count`` most
    relevant patches replaced by ``replacement``) and the insertion input (only those patches kept)."""
    base, order, counts = replacement_of(image, replacement), protocol_order(grid_map, "morf"), np.array([count])
    return torch.cat([protocol_inputs(image, base, order, counts, layout, p) for p in ("morf", "insertion")])


class Top1Agreement(Score):
    """1 when the input's top-1 class is ``label``, else 0 (Chefer's per-image accuracy)."""

    name = "top-1 agreement"
    point = "logits"

    def __init__(self, label: int):
        self.label = self.target = int(label)

    def describe(self) -> str:
        return f"1 when the top-1 class is {self.label} (the unperturbed image's), else 0"

    def of(self, values):
        return (values.argmax(dim=-1) == self.label).double().cpu().numpy()


@dataclass
class ProtocolCurves:
    """Curves of M maps on one image under several protocols.

    Attributes:
        methods: M names; protocols: the protocols run.
        fractions: protocol -> (S,) fractions; curves: protocol -> (M, S) scores.
        score: protocol -> the score in words; replacement: ``"mean"`` or ``"blur"``; target: the class scored
        (None for a headless model's cosine).
    """

    methods: list[str]
    protocols: list[str]
    fractions: dict[str, np.ndarray]
    curves: dict[str, np.ndarray]
    score: dict[str, str]
    replacement: str
    target: int | None = None

    def auc(self, protocol: str) -> np.ndarray:
        """(M,) AUC of ``protocol`` (Chefer's x 100), or of the summary :data:`SUMMARY`."""
        if protocol == SUMMARY:
            return self.auc("lerf") - self.auc("morf")
        value = auc(self.curves[protocol], self.fractions[protocol])
        return value * 100 if protocol in CHEFER else value

    def aucs(self) -> dict[str, np.ndarray]:
        """Every protocol's AUC, with the summary when MoRF and LeRF both ran: name -> (M,)."""
        names = list(self.protocols) + ([SUMMARY] if {"morf", "lerf"} <= set(self.protocols) else [])
        return {p: self.auc(p) for p in names}

    def faithfulness(self, maps: dict[str, np.ndarray], num_patches: int) -> Faithfulness:
        """MoRF as the deletion curve and insertion as the insertion curve (both must have run), with the ``maps``
        they ranked ((gh, gw) each, by method name): the :class:`vitviz.perturbation.curves.Faithfulness` the tables
        and figures read."""
        fractions = self.fractions["morf"]
        return Faithfulness(methods=list(self.methods),
                            maps=np.stack([np.asarray(maps[n], dtype=np.float64) for n in self.methods]),
                            fractions=fractions, counts=step_counts(fractions, num_patches),
                            deletion=self.curves["morf"], insertion=self.curves["insertion"], score=self.score["morf"],
                            target=self.target)


def protocol_curves(model, image: torch.Tensor, maps: dict[str, np.ndarray], layout: TokenLayout, *,
                    protocols=PROTOCOLS, replacement: str = "mean", fractions: np.ndarray | None = None,
                    score: Score | None = None, target: int | None = None, batch_size: int = 16,
                    progress: Callable[[int, int], None] | None = None) -> ProtocolCurves:
    """Every map's curves on one image under ``protocols``.

    Args:
        model: a model an adapter reads, in eval mode.
        image: (3, H, W) normalised model input.
        maps: method name -> (gh, gw) map (its descending order is the perturbation order).
        protocols: among :data:`PROTOCOLS` and :data:`CHEFER` (the latter need a classifier head).
        replacement: ``"mean"`` or ``"blur"`` (:data:`REPLACEMENT_TEXT`).
        fractions: (S,) for MoRF, LeRF and insertion, default 0, 0.1, ..., 1; Chefer's are 0, 0.1, ..., 0.9.
        score: for MoRF, LeRF and insertion, default :func:`vitviz.perturbation.curves.default_score`.
        target: the class scored (default the unperturbed top-1); also Chefer's label.
        progress: called with (methods done, methods).
    """
    fractions, base, scores, steps = _setup(model, image, protocols, replacement, fractions, score, target)
    # The unperturbed input and the all-replaced one are shared by every method: scored once per score.
    ends = {id(s): score_inputs(model, torch.stack([image, base]), s) for s in scores.values()}
    names = list(maps)
    curves = {p: np.empty((len(names), len(steps[p]))) for p in protocols}
    for m, name in enumerate(names):
        for p in protocols:
            counts = step_counts(steps[p], layout.num_patches)
            inner = (counts > 0) & (counts < layout.num_patches)
            original, replaced = ends[id(scores[p])]
            first, last = (replaced, original) if p == "insertion" else (original, replaced)
            curves[p][m] = np.where(counts == 0, first, last)
            if inner.any():
                inputs = protocol_inputs(image, base, protocol_order(maps[name], p), counts[inner], layout, p)
                curves[p][m, inner] = score_inputs(model, inputs, scores[p], batch_size)
        if progress is not None:
            progress(m + 1, len(names))
    return _result(names, protocols, steps, curves, scores, replacement)


def _setup(model, image, protocols, replacement, fractions, score, target):
    """One image's replacement (3, H, W), its score per protocol and the fractions per protocol."""
    unknown = [p for p in protocols if p not in PROTOCOLS + CHEFER]
    if unknown:
        raise OptionError(f"unknown protocol {', '.join(unknown)}: choose from {', '.join(PROTOCOLS + CHEFER)}")
    fractions = default_fractions() if fractions is None else np.asarray(fractions, dtype=np.float64)
    base = replacement_of(image, replacement)
    scores: dict[str, Score] = {}
    if any(p in PROTOCOLS for p in protocols):
        scores |= dict.fromkeys([p for p in protocols if p in PROTOCOLS],
                                default_score(model, image, target) if score is None else score)
    if any(p in CHEFER for p in protocols):
        with torch.inference_mode():
            logits = model_logits(model, _to_model(model, image[None])) if _has_head(model) else None
        if logits is None:
            raise ViewNotApplicable("Chefer's positive/negative perturbation counts top-1 agreement and needs a "
                                    "classifier head; this model has none.")
        scores |= dict.fromkeys([p for p in protocols if p in CHEFER],
                                Top1Agreement(int(logits[0].argmax()) if target is None else target))
    steps = {p: chefer_fractions() if p in CHEFER else fractions for p in protocols}
    return fractions, base, scores, steps


def _result(names, protocols, steps, curves, scores, replacement) -> ProtocolCurves:
    first_score = next(iter(scores.values()))
    return ProtocolCurves(methods=names, protocols=list(protocols), fractions=steps, curves=curves,
                          score={p: scores[p].describe() for p in protocols}, replacement=replacement,
                          target=getattr(first_score, "target", None))


def protocol_curves_batch(model, images: torch.Tensor, maps: list[dict[str, np.ndarray]], layout: TokenLayout, *,
                          protocols=PROTOCOLS, replacement: str = "mean", fractions: np.ndarray | None = None,
                          target: int | None = None, batch_size: int = 64) -> list[ProtocolCurves]:
    """:func:`protocol_curves` of every image of a batch, its perturbed inputs through the model together.

    Every perturbed input of every image, map and protocol (and each image's unperturbed and all-replaced input)
    is one row; the rows whose scores read the same model point (logits or the pooled vector) go through the
    model ``batch_size`` at a time, built as they are needed (at most ``batch_size`` inputs held at once), and each
    row is scored by its own image's score. The model's forward treats the rows of a batch independently, so the
    curves are those of :func:`protocol_curves` image by image (tests/test_faithfulness_batched.py checks them bit
    for bit on the CPU).

    Args:
        images: (B, 3, H, W) normalised model inputs. maps: per image, method name -> (gh, gw) map.
        target: the class scored for every image (default each image's unperturbed top-1); Chefer's label too.
        batch_size: inputs per forward (the memory bound: ``batch_size`` inputs and their activations).
        The other arguments as :func:`protocol_curves`.

    Returns:
        one :class:`ProtocolCurves` per image.
    """
    setups = [_setup(model, image, protocols, replacement, fractions, None, target) for image in images]
    curves = [{p: np.empty((len(m), len(setup[3][p]))) for p in protocols} for m, setup in zip(maps, setups)]
    rows = []  # (image, score, where the scores go: fn(values (n,)), the inputs (n, 3, H, W) made when needed)
    for i, (image, (_, base, scores, steps)) in enumerate(zip(images, setups)):
        for score in {id(s): s for s in scores.values()}.values():
            rows.append((score, _ends_into(curves[i], scores, score, steps, layout.num_patches),
                         lambda image=image, base=base: torch.stack([image, base])))
        for m, name in enumerate(maps[i]):
            for p in protocols:
                counts = step_counts(steps[p], layout.num_patches)
                inner = (counts > 0) & (counts < layout.num_patches)
                if inner.any():
                    def put(values, c=curves[i][p], m=m, inner=inner):
                        c[m, inner] = values
                    rows.append((scores[p], put, lambda image=image, base=base, name=name, p=p, i=i, inner=inner,
                                 counts=counts: protocol_inputs(image, base, protocol_order(maps[i][name], p),
                                                                counts[inner], layout, p)))
    group = lambda score: score.point or id(score)  # noqa: E731 (rows that can share a forward)
    for key in dict.fromkeys(group(score) for score, _, _ in rows):
        _score_rows(model, [r for r in rows if group(r[0]) == key], batch_size)
    return [_result(list(m), protocols, setup[3], c, setup[2], replacement)
            for m, setup, c in zip(maps, setups, curves)]


def _ends_into(curves: dict, scores: dict, score: Score, steps: dict, num_patches: int):
    """Where an image's (unperturbed, all-replaced) scores under ``score`` go: every map's 0 % and 100 % points of
    the protocols scored by it."""
    def put(values):
        original, replaced = values
        for p, s in scores.items():
            if s is score:
                counts = step_counts(steps[p], num_patches)
                first, last = (replaced, original) if p == "insertion" else (original, replaced)
                outer = ~((counts > 0) & (counts < num_patches))
                curves[p][:, outer] = np.where(counts == 0, first, last)[outer]
    return put


def _score_rows(model, rows: list, batch_size: int) -> None:
    """Score ``rows`` (score, put, make inputs) that read the same point (or share one ``__call__``-only score):
    their inputs are made in order and go through the model ``batch_size`` per forward (a row's inputs may be
    split between two forwards); each row's scores are handed to its ``put`` at the end."""
    got: list[list[np.ndarray]] = [[] for _ in rows]
    queue: deque = deque()  # (row, inputs) not yet through the model
    held = 0

    def forward() -> None:
        nonlocal held
        parts, n = [], 0
        while queue and n < batch_size:
            k, inputs = queue.popleft()
            take = min(len(inputs), batch_size - n)
            if take < len(inputs):
                queue.appendleft((k, inputs[take:]))
            parts.append((k, inputs[:take]))
            n += take
        held -= n
        x = _to_model(model, torch.cat([inputs for _, inputs in parts]))
        first = rows[parts[0][0]][0]
        with torch.inference_mode():
            if first.point is None:  # one score object for the whole group
                scored = first(model, x)
            else:
                values = trace_model(model, x, keep=(first.point,), fast=True, grad=None)[first.point]
        start = 0
        for k, inputs in parts:
            end = start + len(inputs)
            got[k].append(scored[start:end] if first.point is None else rows[k][0].of(values[start:end]))
            start = end

    for k, (_, _, make) in enumerate(rows):
        inputs = make()
        queue.append((k, inputs))
        held += len(inputs)
        while held >= batch_size:
            forward()
    while queue:
        forward()
    for (_, put, _), chunks in zip(rows, got):
        put(np.concatenate(chunks))


def _has_head(model) -> bool:
    from ..adapters import adapter_for

    return adapter_for(model).num_classes(model) > 0
