"""Heads switched off or swapped, and how far the output moves (activation patching, as TransformerLens and
ViT-Prisma do it), through the Trace's ``edit=`` points: the model is never changed.

- **Ablation**: a head's context (the ``z`` point, (B, H, N, d), before the output projection) set to zero or to
  its mean over the image set (per token position), for one head, a set of heads, or every head of a layer.
  Zeroing z removes the head's term of the output projection (the projection's bias stays).
- **Patching**: image B run with one head's context taken from image A's forward; the effect is how far B's
  output moves towards A's: 0 = unchanged, 1 = A's output.

Outputs and effects (per image):

- ``pooled_cosine``: cosine between the pooled vector (what the head reads) after and before the edit
  (1 = unchanged);
- models with a classifier: ``logit_change`` (the edited logit minus the plain one, for the plain run's top-1
  class), ``probability_before`` / ``probability_after`` of that class (softmax), ``top1_kept`` (1 if the top-1
  class is the same);
- patching: ``pooled_towards_a`` = <p - p_B, p_A - p_B> / ‖p_A - p_B‖² on the pooled vectors (the share of the
  way from B to A along the line between them) and, with a classifier, ``logit_diff_towards_a`` =
  (LD - LD_B) / (LD_A - LD_B) with LD = logit[A's top-1] - logit[B's top-1] (the standard normalised patching
  metric).

Layers and heads are 0-based here; the CLI and the screen count them from 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from ..errors import VitvizError

ABLATIONS = ("zero", "mean")
ABLATION_TEXT = {
    "zero": "the head's context z (attention @ v, before the output projection) set to 0",
    "mean": "the head's context z set to its mean over the image set, token position by token position",
}
Progress = Callable[[int, int], None]


def _output_point(lens) -> str:
    return "logits" if lens.has_head else "pooled"


def _heads_of(lens, layer: int) -> int:
    return lens.adapter.num_heads(lens.model, layer)


def parse_heads(text: str, num_layers: int, heads_of: Callable[[int], int]) -> list[tuple[int, int]]:
    """1-based ``"3.2,3.4"`` (layer.head), ``"3"`` (every head of layer 3) or ``"all"`` -> 0-based (layer, head) pairs.

    Raises:
        VitvizError: a part that is not a layer or layer.head in range (the sentence names it).
    """
    pairs: list[tuple[int, int]] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if part == "all":
            pairs += [(l, h) for l in range(num_layers) for h in range(heads_of(l))]
            continue
        pieces = part.split(".")
        if len(pieces) not in (1, 2) or not all(p.isdigit() for p in pieces):
            raise VitvizError(f"{part!r} is not a layer or layer.head: write e.g. 3 (every head of layer 3), 3.2 "
                              "(layer 3, head 2; both 1-based) or all.")
        layer = int(pieces[0]) - 1
        if not 0 <= layer < num_layers:
            raise VitvizError(f"layer {pieces[0]} in {part!r} is out of range: the model has layers 1 to {num_layers}.")
        if len(pieces) == 1:
            pairs += [(layer, h) for h in range(heads_of(layer))]
            continue
        head = int(pieces[1]) - 1
        if not 0 <= head < heads_of(layer):
            raise VitvizError(f"head {pieces[1]} in {part!r} is out of range: layer {layer + 1} has heads 1 to "
                              f"{heads_of(layer)}.")
        pairs.append((layer, head))
    if not pairs:
        raise VitvizError("no heads given: write e.g. 3.2, 3 or all.")
    return list(dict.fromkeys(pairs))


def _by_layer(pairs: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for layer, head in pairs:
        out.setdefault(layer, []).append(head)
    return out


def head_means(lens, x, layers: Iterable[int]) -> dict[int, torch.Tensor]:
    """Each layer's context z averaged over the image set, token position by token position:
    layer -> (1, H, N, d) (window attention: (1, nW, H, T, d))."""
    layers = sorted(set(layers))
    if not layers:
        return {}
    trace = lens.trace(x, keep=[("z", l) for l in layers], stop_after=("z", layers[-1]))
    return {l: trace["z", l].mean(dim=0, keepdim=True) for l in layers}


def ablation_edit(pairs: Iterable[tuple[int, int]], mode: str = "zero",
                  means: dict[int, torch.Tensor] | None = None) -> dict[str, Callable]:
    """``edit=`` that ablates the given (layer, head) pairs (0-based) at the ``z`` point.

    Args:
        mode: ``"zero"`` or ``"mean"`` (then ``means`` from :func:`head_means` for every layer involved).
    """
    if mode not in ABLATIONS:
        raise VitvizError(f"unknown ablation {mode!r}: choose zero or mean.")
    edits = {}
    for layer, heads in _by_layer(pairs).items():
        mean = None if mode == "zero" else means[layer]

        def fn(z, point, heads=heads, mean=mean):
            z = z.clone()
            for h in heads:
                z[..., h, :, :] = 0 if mean is None else mean[..., h, :, :]
            return z
        edits[f"blocks.{layer}.z"] = fn
    return edits


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.double().softmax(dim=-1)


@dataclass(frozen=True)
class Outputs:
    """The outputs of one batch: pooled (B, D) float64 and logits (B, C) float64 or None."""

    pooled: torch.Tensor
    logits: torch.Tensor | None


def outputs(lens, x, edit=None) -> Outputs:
    """The pooled vector (and the logits, for a model with a head) of one forward, float64 on the host."""
    keep = ("pooled", "logits") if lens.has_head else ("pooled",)
    trace = lens.trace(x, keep=keep, edit=edit)
    logits = trace.logits
    return Outputs(trace.pooled.detach().double().cpu(), None if logits is None else logits.detach().double().cpu())


def change(before: Outputs, after: Outputs) -> dict[str, np.ndarray]:
    """The effects of an ablation per image: kind -> (B,) (the module docstring defines each kind)."""
    cos = torch.nn.functional.cosine_similarity(after.pooled, before.pooled, dim=-1)
    out = {"pooled_cosine": cos.numpy()}
    if before.logits is not None:
        top = before.logits.argmax(-1)
        rows = torch.arange(len(top))
        out["logit_change"] = (after.logits[rows, top] - before.logits[rows, top]).numpy()
        out["probability_before"] = _softmax(before.logits)[rows, top].numpy()
        out["probability_after"] = _softmax(after.logits)[rows, top].numpy()
        out["top1_kept"] = (after.logits.argmax(-1) == top).double().numpy()
    return out


@dataclass(frozen=True)
class Effects:
    """One effect table: rows of (image, layer, head, kind, effect); layer and head 0-based, head -1 for a set."""

    rows: list[tuple[int, int, int, str, float]]

    def grid(self, kind: str, num_layers: int, num_heads: int, image: int = 0) -> np.ndarray:
        """(L, H) of one kind for one image, NaN where a head was not run."""
        out = np.full((num_layers, num_heads), np.nan)
        for i, l, h, k, e in self.rows:
            if k == kind and i == image and h >= 0:
                out[l, h] = e
        return out

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(k for _, _, _, k, _ in self.rows))


def ablate(lens, x, pairs: Sequence[tuple[int, int]], mode: str = "zero", each: bool = True,
           progress: Progress | None = None) -> Effects:
    """Ablate heads and measure the output change.

    Args:
        x: the image set (a ModelInput or a (B, 3, H, W) tensor); the mean of ``mode="mean"`` runs over it.
        pairs: 0-based (layer, head) pairs.
        each: one forward per head (a layer x head picture) or, if False, every given head at once (head -1).
        progress: called with (done, total) after each forward.

    Returns:
        Effects per image (:func:`change`'s kinds).
    """
    pairs = list(pairs)
    means = head_means(lens, x, [l for l, _ in pairs]) if mode == "mean" else None
    before = outputs(lens, x)
    groups = [[p] for p in pairs] if each else [pairs]
    rows = []
    for done, group in enumerate(groups, 1):
        after = outputs(lens, x, ablation_edit(group, mode, means))
        layer, head = group[0] if each else (group[0][0] if len({l for l, _ in group}) == 1 else -1, -1)
        for kind, values in change(before, after).items():
            rows += [(i, layer, head, kind, float(v)) for i, v in enumerate(values)]
        if progress:
            progress(done, len(groups))
    return Effects(rows)


def patch_edit(pairs: Sequence[tuple[int, int]], source: dict[int, torch.Tensor]) -> dict[str, Callable]:
    """``edit=`` that runs a batch of K copies of image B, copy i with head ``pairs[i]``'s context z taken from
    ``source[layer]`` (A's z, (1, H, N, d)). One pair: a batch of B's own size."""
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for i, (layer, head) in enumerate(pairs):
        by_layer.setdefault(layer, []).append((i, head))

    def fn(z, point):
        z = z.clone()
        for i, head in by_layer[point.layer]:
            z[i, ..., head, :, :] = source[point.layer][0, ..., head, :, :]
        return z
    return {f"blocks.{layer}.z": fn for layer in by_layer}


def towards(a: Outputs, b: Outputs, patched: Outputs) -> dict[str, np.ndarray]:
    """How far each patched output moved from B's towards A's: kind -> (K,) (module docstring)."""
    direction = a.pooled - b.pooled  # (1, D)
    scale = float((direction * direction).sum())
    moved = ((patched.pooled - b.pooled) * direction).sum(-1) / (scale if scale > 0 else float("nan"))
    out = {"pooled_towards_a": moved.numpy()}
    if a.logits is not None:
        ca, cb = int(a.logits.argmax()), int(b.logits.argmax())
        ld = lambda o: o.logits[:, ca] - o.logits[:, cb]  # noqa: E731
        span = float(ld(a) - ld(b))
        out["logit_diff_towards_a"] = ((ld(patched) - ld(b)) / (span if span != 0 else float("nan"))).numpy()
    return out


def patch(lens, image_a, image_b, pairs: Sequence[tuple[int, int]], batch: int = 1,
          progress: Progress | None = None) -> Effects:
    """Patch each head's context from A's forward into B's and measure how far B's output moves towards A's.

    Args:
        image_a, image_b: one image each (ModelInput or (1, 3, H, W) tensor).
        pairs: 0-based (layer, head) pairs, each patched alone.
        batch: heads patched per forward (copies of B in one batch). 1 is exact; more is faster on a GPU and
            equal to rounding (float32 kernels may sum in another order for another batch size).
        progress: called with (done, total pairs) after each forward.

    Returns:
        Effects with image 0, one row per pair and kind (:func:`towards`).
    """
    tensor = lambda x: getattr(x, "tensor", x)  # noqa: E731
    xa, xb = tensor(image_a), tensor(image_b)
    if xa.shape[0] != 1 or xb.shape[0] != 1:
        raise VitvizError("patching takes one image A and one image B.")
    pairs = list(pairs)
    layers = sorted({l for l, _ in pairs})
    trace = lens.trace(xa, keep=[("z", l) for l in layers] + ["pooled"] + (["logits"] if lens.has_head else []))
    source = {l: trace["z", l] for l in layers}
    a = Outputs(trace.pooled.double().cpu(), None if trace.logits is None else trace.logits.double().cpu())
    b = outputs(lens, xb)
    rows = []
    for start in range(0, len(pairs), batch):
        chunk = pairs[start:start + batch]
        patched = outputs(lens, xb.expand(len(chunk), *xb.shape[1:]), patch_edit(chunk, source))
        for kind, values in towards(a, b, patched).items():
            rows += [(0, l, h, kind, float(v)) for (l, h), v in zip(chunk, values)]
        if progress:
            progress(start + len(chunk), len(pairs))
    return Effects(rows)


def readout_maps(lens, x, edit=None, layer: int = -1) -> np.ndarray:
    """The readout's attention over the patches in ``layer`` (0-based, default the last), mean over heads, of the
    first image of ``x``, with an ``edit`` applied (an ablation) or without: (gh, gw) float32.

    The readout is the CLS query where the model has one, else the mean over patch queries (as on the heads page).
    """
    from ..analyses.maps import layer_maps

    tensor = getattr(x, "tensor", x)[:1]
    trace = lens.trace(tensor, keep=[("attn", layer)], edit=edit)
    attention = trace["attn", layer][0].float().cpu().numpy()[None]  # (1, H, N, N)
    layout = trace.layout
    return layer_maps(attention, layout, 0, "cls" if layout.has_class_token else "mean").mean(0)
