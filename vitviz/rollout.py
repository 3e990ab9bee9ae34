"""Attention rollout (Abnar & Zuidema 2020), done as defined, with the anchors' bugs avoided.

Per layer: fuse heads, optionally zero the lowest ``discard`` fraction of weights (never the
readout token's own column), A' = 0.5 A + 0.5 I with every row renormalised (vit-explain
forgets keepdim here), then R = A'_end ... A'_start.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import TokenLayout

FUSIONS = ("mean", "max", "min")


@dataclass
class Rollout:
    """Result of :func:`rollout`.

    Attributes:
        map: (gh, gw) rollout of the readout over patch tokens (raw mass, not rescaled).
        per_layer: (n_layers, gh, gw) cumulative rollout after each layer of the range.
        prefix_share: mass of the readout on each prefix token (CLS, distillation, registers).
        layers: (start, end) layer range used, end exclusive.
        readout: ``"cls"`` or ``"mean over patch rows"``.
    """

    map: np.ndarray
    per_layer: np.ndarray
    prefix_share: dict[str, float]
    layers: tuple[int, int]
    readout: str


def fuse_heads(attention: np.ndarray, fusion: str = "mean") -> np.ndarray:
    """(..., H, N, N) -> (..., N, N) by mean, max or min over heads."""
    if fusion not in FUSIONS:
        raise ValueError(f"head fusion must be one of {FUSIONS}, not {fusion!r}")
    return getattr(np, fusion)(attention, axis=-3)


def discard_lowest(attention: np.ndarray, fraction: float, keep_column: int | None) -> np.ndarray:
    """Zero the lowest ``fraction`` of the weights of an (N, N) matrix, sparing ``keep_column``."""
    if not 0 <= fraction < 1:
        raise ValueError(f"discard ratio must be in [0, 1), not {fraction}")
    if fraction == 0:
        return attention
    out = attention.copy()
    candidates = np.ones_like(out, dtype=bool)
    if keep_column is not None:
        candidates[:, keep_column] = False
    values = out[candidates]
    k = int(fraction * values.size)
    if k:
        drop = np.argpartition(values, k - 1)[:k]
        values[drop] = 0
        out[candidates] = values
    return out


def rollout_step(attention: np.ndarray, exclude: tuple[int, ...] = ()) -> np.ndarray:
    """A' = 0.5 A + 0.5 I, rows renormalised; excluded tokens' columns zeroed first. (N, N) -> (N, N)."""
    a = attention.astype(np.float64, copy=True)
    if exclude:
        a[:, list(exclude)] = 0
    a = 0.5 * a + 0.5 * np.eye(a.shape[-1])
    return a / a.sum(axis=-1, keepdims=True)


def readout_row(R: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """The row read out of a rollout matrix: the CLS row, or the mean of the patch rows. (N, N) -> (N,)."""
    return R[layout.cls_index] if layout.has_class_token else R[layout.patch_slice].mean(axis=0)


def readout_vector(layout: TokenLayout) -> np.ndarray:
    """The row vector e with e @ R == readout_row(R): one-hot on CLS, or uniform over patches. (N,) float64."""
    e = np.zeros(layout.num_tokens)
    if layout.has_class_token:
        e[layout.cls_index] = 1.0
    else:
        e[layout.patch_slice] = 1.0 / layout.num_patches
    return e


def _check_range(L: int, start: int, end: int | None) -> int:
    end = L if end is None else end
    if not 0 <= start < end <= L:
        raise ValueError(f"layer range must satisfy 0 <= start < end <= {L}, got ({start}, {end})")
    return end


def rollout(attention: np.ndarray, layout: TokenLayout, *, fusion: str = "mean", discard: float = 0.0,
            start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = ()) -> Rollout:
    """Attention rollout of one image.

    Only rows of R = A'_end ... A'_start are read, so R is never formed: the readout row is the
    row-vector chain e A'_end ... A'_start (vector-matrix products, O(L N^2) instead of O(L N^3)),
    and the cumulative map after each layer l is its own chain e A'_l ... A'_start, all chains
    advanced together as one (k, N) @ (N, N) product per layer. Float64 throughout; equal to the
    matrix products to rounding (tests: 1e-10).

    Args:
        attention: (L, H, N, N) attention probabilities.
        layout: token layout.
        fusion: head fusion, ``"mean"``, ``"max"`` or ``"min"``.
        discard: fraction of the lowest fused weights zeroed per layer.
        start, end: layer range [start, end); default all layers.
        exclude_tokens: token indices no mass may flow through (e.g. high-norm artifact tokens).

    Returns:
        Rollout with map (gh, gw) and per_layer (end - start, gh, gw).
    """
    end = _check_range(attention.shape[0], start, end)
    e = readout_vector(layout)
    # chains[i] is the chain that started at layer end-1-i; each new layer (going down) starts one more.
    chains = np.empty((0, e.size))
    for layer in range(end - 1, start - 1, -1):
        step = rollout_step(discard_lowest(fuse_heads(attention[layer], fusion), discard, layout.cls_index),
                            exclude_tokens)
        chains = np.vstack([chains, e]) @ step
    rows = chains[::-1]  # rows[j]: readout after layers start..start+j
    per_layer = layout.to_grid(rows[:, layout.patch_slice])
    return Rollout(
        map=per_layer[-1],
        per_layer=per_layer,
        prefix_share={name: float(rows[-1, i]) for i, name in enumerate(layout.prefix_tokens)},
        layers=(start, end),
        readout="cls" if layout.has_class_token else "mean over patch rows",
    )


def rollout_reference(attention: np.ndarray, layout: TokenLayout, *, fusion: str = "mean", discard: float = 0.0,
                      start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = ()) -> Rollout:
    """:func:`rollout` by its definition, R = A'_end ... A'_start as full N x N products (O(L N^3)).

    Kept as the reference the tests and benchmarks hold the row-vector chain against.
    """
    end = _check_range(attention.shape[0], start, end)
    R = np.eye(attention.shape[-1])
    per_layer = []
    for layer in range(start, end):
        fused = discard_lowest(fuse_heads(attention[layer], fusion), discard, layout.cls_index)
        R = rollout_step(fused, exclude_tokens) @ R
        per_layer.append(layout.to_grid(readout_row(R, layout)[layout.patch_slice]))
    row = readout_row(R, layout)
    return Rollout(map=per_layer[-1], per_layer=np.stack(per_layer),
                   prefix_share={name: float(row[i]) for i, name in enumerate(layout.prefix_tokens)},
                   layers=(start, end), readout="cls" if layout.has_class_token else "mean over patch rows")


def attention_gradients(model, images, target: int | None = None):
    """Attention of every layer and the gradient of one class logit with respect to it.

    Each layer's gradient is taken at that same layer's attention (vit-explain issue #6 paired
    them with the wrong layers). The model is not changed: gradients flow from the input.

    Args:
        model: a supported ViT (timm or transformers) with a classifier head.
        images: (1, 3, H, W) normalised input.
        target: class index; default the top-1 class.

    Returns:
        (attention (L, H, N, N), gradients (L, H, N, N), target class) as float64 numpy arrays.
    """
    import torch

    from .capture import attention_and_logits, num_classes, to_model_input

    if num_classes(model) <= 0:
        raise ValueError("Gradient-weighted rollout needs a classifier head; this model has none.")
    with torch.enable_grad():
        x = to_model_input(model, images).detach().requires_grad_(True)
        layers, logits = attention_and_logits(model, x)
        for probs in layers:
            probs.retain_grad()
        target = int(logits[0].argmax()) if target is None else int(target)
        logits[0, target].backward()
    attention = np.stack([p[0].detach().double().cpu().numpy() for p in layers])
    grads = np.stack([p.grad[0].double().cpu().numpy() for p in layers])
    return attention, grads, target


def gradient_rollout(attention: np.ndarray, gradients: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Class-specific gradient-weighted rollout (Chefer et al. 2021, generic rule).

    R = I; for each layer R += mean_h((dy/dA * A)^+) @ R; read the CLS row (or the mean of patch
    rows without CLS) over patch tokens. Since R_L = (I + M_L) ... (I + M_1), the readout row is the
    row-vector chain v <- v + v M_l from the last layer down: O(L N^2), float64 one layer at a time.
    attention, gradients: (L, H, N, N) -> (gh, gw).
    """
    v = readout_vector(layout)
    for a, g in zip(attention[::-1], gradients[::-1]):
        m = np.clip(g.astype(np.float64) * a, 0, None).mean(axis=0)
        v = v + v @ m
    return layout.to_grid(v[layout.patch_slice])


def gradient_rollout_reference(attention: np.ndarray, gradients: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """:func:`gradient_rollout` by its definition with full N x N products; the tests' reference."""
    R = np.eye(attention.shape[-1])
    for a, g in zip(attention, gradients):
        R = R + np.clip(g.astype(np.float64) * a, 0, None).mean(axis=0) @ R
    return layout.to_grid(readout_row(R, layout)[layout.patch_slice])
