"""Attention rollout (Abnar & Zuidema 2020), done as defined, with the anchors' bugs avoided.

Per layer: fuse heads, optionally zero the lowest ``discard`` fraction of weights (never the
readout token's own column), A' = 0.5 A + 0.5 I with every row renormalised (vit-explain
forgets keepdim here), then R = A'_end ... A'_start.

Computed in torch, float64, on the device the attention is on (numpy arrays are read without a
copy); only the maps come back to the host.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import OptionError, ViewNotApplicable
from ..layout import TokenLayout
from ..tensors import as_tensor, to_host

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


def _like(result: torch.Tensor, given: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """numpy in, numpy out; a tensor stays a tensor on its device."""
    return to_host(result) if isinstance(given, np.ndarray) else result


def fuse_heads(attention: np.ndarray | torch.Tensor, fusion: str = "mean") -> np.ndarray | torch.Tensor:
    """(..., H, N, N) -> (..., N, N) by mean, max or min over heads."""
    if fusion not in FUSIONS:
        raise OptionError(f"head fusion must be one of {FUSIONS}, not {fusion!r}")
    a = as_tensor(attention)
    return _like(a.mean(dim=-3) if fusion == "mean" else getattr(a, "a" + fusion)(dim=-3), attention)


def discard_lowest(attention: np.ndarray | torch.Tensor, fraction: float,
                   keep_column: int | None) -> np.ndarray | torch.Tensor:
    """Zero the lowest ``fraction`` of the weights of an (N, N) matrix, sparing ``keep_column``."""
    if not 0 <= fraction < 1:
        raise OptionError(f"discard ratio must be in [0, 1), not {fraction}")
    if fraction == 0:
        return attention
    out = as_tensor(attention).clone()
    candidates = torch.ones_like(out, dtype=torch.bool)
    if keep_column is not None:
        candidates[:, keep_column] = False
    values = out[candidates]
    k = int(fraction * values.numel())
    if k:
        values[torch.topk(values, k, largest=False, sorted=False).indices] = 0
        out[candidates] = values
    return _like(out, attention)


def rollout_step(attention: np.ndarray | torch.Tensor, exclude: tuple[int, ...] = ()) -> np.ndarray | torch.Tensor:
    """A' = 0.5 A + 0.5 I, rows renormalised; excluded tokens' columns zeroed first. (N, N) -> (N, N) float64."""
    a = as_tensor(attention).to(torch.float64, copy=True)
    if exclude:
        a[:, list(exclude)] = 0
    a.mul_(0.5).diagonal().add_(0.5)  # in place: no N x N identity and no temporaries
    return _like(a.div_(a.sum(dim=-1, keepdim=True)), attention)


def readout_index(layout: TokenLayout, query: int | None = None) -> int | None:
    """The token whose row is read out: CLS (None without one), or patch ``query`` (raster order, 0-based)."""
    return layout.cls_index if query is None else layout.num_prefix_tokens + int(query)


def readout_row(R: np.ndarray, layout: TokenLayout, query: int | None = None) -> np.ndarray:
    """The row read out of a rollout matrix: the CLS row, or the mean of the patch rows, or patch ``query``'s row.

    (N, N) -> (N,).
    """
    index = readout_index(layout, query)
    return R[index] if index is not None else R[layout.patch_slice].mean(axis=0)


def readout_vector(layout: TokenLayout, query: int | None = None) -> np.ndarray:
    """The row vector e with e @ R == readout_row(R, layout, query): one-hot on the readout token, or
    uniform over patches (no CLS and no query). (N,) float64."""
    e = np.zeros(layout.num_tokens)
    index = readout_index(layout, query)
    if index is not None:
        e[index] = 1.0
    else:
        e[layout.patch_slice] = 1.0 / layout.num_patches
    return e


def readout_name(layout: TokenLayout, query: int | None = None) -> str:
    """What a rollout reads out, as its result and files record it: "cls", "mean over patch rows" (no class token)
    or "patch 7 (raster order, 0-based)"."""
    if query is not None:
        return f"patch {int(query)} (raster order, 0-based)"
    return "cls" if layout.has_class_token else "mean over patch rows"


def readout_label(layout: TokenLayout, query: int | None = None) -> str:
    """The same readout as a page or a figure title names it: "CLS", "mean over patch rows" or "patch 7"."""
    if query is not None:
        return f"patch {int(query)}"
    return "CLS" if layout.has_class_token else "mean over patch rows"


def _check_range(L: int, start: int, end: int | None) -> int:
    end = L if end is None else end
    if not 0 <= start < end <= L:
        raise OptionError(f"layer range must satisfy 0 <= start < end <= {L}, got ({start}, {end})")
    return end


def rollout(attention: np.ndarray | torch.Tensor, layout: TokenLayout, *, fusion: str = "mean",
            discard: float = 0.0, start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = (),
            query: int | None = None) -> Rollout:
    """Attention rollout of one image.

    Only rows of R = A'_end ... A'_start are read, so R is never formed: the readout row is the
    row-vector chain e A'_end ... A'_start (vector-matrix products, O(L N^2) instead of O(L N^3)),
    and the cumulative map after each layer l is its own chain e A'_l ... A'_start, all chains
    advanced together as one (k, N) @ (N, N) product per layer. Float64 throughout, on the
    attention's device; equal to the matrix products to rounding (tests: 1e-10).

    Args:
        attention: (L, H, N, N) attention probabilities, numpy or a tensor on any device.
        layout: token layout.
        fusion: head fusion, ``"mean"``, ``"max"`` or ``"min"``.
        discard: fraction of the lowest fused weights zeroed per layer (never the readout token's column).
        start, end: layer range [start, end); default all layers.
        exclude_tokens: token indices no mass may flow through (e.g. high-norm artifact tokens).
        query: read out this patch's row (raster order, 0-based: a clicked patch) instead of the
            readout (CLS, or the mean of the patch rows).

    Returns:
        Rollout with map (gh, gw) and per_layer (end - start, gh, gw).
    """
    end = _check_range(attention.shape[0], start, end)
    a = as_tensor(attention)
    e = torch.as_tensor(readout_vector(layout, query), device=a.device)
    keep = readout_index(layout, query)
    # chains[i] is the chain that started at layer end-1-i; each new layer (going down) starts one more.
    chains = e.new_empty((0, e.numel()))
    for layer in range(end - 1, start - 1, -1):
        step = rollout_step(discard_lowest(fuse_heads(a[layer], fusion), discard, keep), exclude_tokens)
        chains = torch.cat([chains, e[None]]) @ step
    rows = to_host(chains.flip(0))  # rows[j]: readout after layers start..start+j
    per_layer = layout.patch_grid(rows)
    return Rollout(
        map=per_layer[-1],
        per_layer=per_layer,
        prefix_share={name: float(rows[-1, i]) for i, name in enumerate(layout.prefix_tokens)},
        layers=(start, end),
        readout=readout_name(layout, query),
    )


def rollout_patch_rows(attention: np.ndarray | torch.Tensor, layout: TokenLayout, *, fusion: str = "mean",
                       start: int = 0, end: int | None = None,
                       exclude_tokens: tuple[int, ...] = ()) -> Iterator[torch.Tensor]:
    """Every patch's rollout row over patch columns after each layer of the range, one layer at a time.

    Without discard every query shares the same A' per layer, so the rows of all patch queries are the
    patch rows of M_j = A'_{start+j} ... A'_start, one (N, N) product per layer; row q of layer j equals
    ``rollout(..., query=q).per_layer[j]``. (With discard each query spares its own column, so each
    patch has its own chain: use :func:`rollout` with ``query``.)

    Yields:
        end - start tensors (P, P) float64 on the attention's device: [query patch, key patch].
    """
    end = _check_range(attention.shape[0], start, end)
    a = as_tensor(attention)
    ps = layout.patch_slice
    M = None
    for layer in range(start, end):
        step = rollout_step(fuse_heads(a[layer], fusion), exclude_tokens)
        M = step if M is None else step @ M
        yield M[ps, ps]


def patch_tokens(layout: TokenLayout, patches) -> tuple[int, ...]:
    """Sequence indices of patches: (P,) raster indices over the grid (0-based) -> the tokens rollout's
    ``exclude_tokens`` takes (offset by the prefix tokens), in the order given."""
    return tuple(int(p) + layout.num_prefix_tokens for p in patches)


def token_patches(layout: TokenLayout, tokens) -> list[int]:
    """The patches among sequence indices ``tokens``: raster indices over the grid (0-based), sorted, unique;
    prefix tokens (CLS, registers) are left out. The inverse of :func:`patch_tokens` on patch tokens."""
    return sorted({int(t) - layout.num_prefix_tokens for t in tokens if int(t) >= layout.num_prefix_tokens})


def mass_on(grid_map: np.ndarray, patches) -> float:
    """The readout's rollout mass on ``patches``: the sum of a (gh, gw) map (e.g. :attr:`Rollout.map`, raw mass, the
    readout's row summing to 1 over all tokens) over raster indices ``patches`` (0-based); 0 for none.

    With the map of a rollout run without exclusions, it is what the patches would take away if kept out.
    """
    patches = np.asarray(patches, dtype=int).ravel()
    return float(np.asarray(grid_map, dtype=np.float64).ravel()[patches].sum()) if patches.size else 0.0


def rollout_reference(attention: np.ndarray, layout: TokenLayout, *, fusion: str = "mean", discard: float = 0.0,
                      start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = (),
                      query: int | None = None) -> Rollout:
    """:func:`rollout` by its definition, R = A'_end ... A'_start as full N x N products (O(L N^3)).

    Kept as the reference the tests and benchmarks hold the row-vector chain against.
    """
    end = _check_range(attention.shape[0], start, end)
    R = np.eye(attention.shape[-1])
    per_layer = []
    for layer in range(start, end):
        fused = discard_lowest(fuse_heads(attention[layer], fusion), discard, readout_index(layout, query))
        R = rollout_step(fused, exclude_tokens) @ R
        per_layer.append(layout.patch_grid(readout_row(R, layout, query)))
    row = readout_row(R, layout, query)
    return Rollout(map=per_layer[-1], per_layer=np.stack(per_layer),
                   prefix_share={name: float(row[i]) for i, name in enumerate(layout.prefix_tokens)},
                   layers=(start, end), readout=readout_name(layout, query))


def attention_gradients(model, images, target: int | None = None):
    """Attention of every layer and the gradient of one class logit with respect to it.

    Each layer's gradient is taken at that same layer's attention (vit-explain issue #6 paired
    them with the wrong layers). The model is not changed: gradients flow from the input.

    Args:
        model: a supported ViT (timm or transformers) with a classifier head.
        images: (1, 3, H, W) normalised input.
        target: class index; default the top-1 class.

    Returns:
        (attention (L, H, N, N), gradients (L, H, N, N), target class): float32 numpy arrays, the
        precision the model computes them in; :func:`gradient_rollout` accumulates in float64.
    """
    from ..adapters import adapter_for
    from ..types import to_model_input

    if adapter_for(model).num_classes(model) <= 0:
        raise ViewNotApplicable("Gradient-weighted rollout needs a classifier head; this model has none.")
    with torch.enable_grad():
        x = to_model_input(model, images).detach().requires_grad_(True)
        layers, logits = _attention_and_logits(model, x)
        for probs in layers:
            probs.retain_grad()
        target = int(logits[0].argmax()) if target is None else int(target)
        logits[0, target].backward()
    del logits, x
    attention = np.empty((len(layers), *layers[0].shape[1:]), np.float32)
    grads = np.empty_like(attention)
    for i in range(len(layers)):
        attention[i], grads[i] = to_host(layers[i][0].float()), to_host(layers[i].grad[0].float())
        layers[i] = None  # the graph is gone after backward: each layer's memory goes as it is copied
    return attention, grads, target


def gradient_rollout(attention: np.ndarray | torch.Tensor, gradients: np.ndarray | torch.Tensor,
                     layout: TokenLayout) -> np.ndarray:
    """Class-specific gradient-weighted rollout (Chefer et al. 2021, generic rule).

    R = I; for each layer R += mean_h((dy/dA * A)^+) @ R; read the CLS row (or the mean of patch
    rows without CLS) over patch tokens. Since R_L = (I + M_L) ... (I + M_1), the readout row is the
    row-vector chain v <- v + v M_l from the last layer down: O(L N^2), float64 one layer at a time
    (one (H, N, N) float64 temporary), on the attention's device.
    attention, gradients: (L, H, N, N) -> (gh, gw).
    """
    a, g = as_tensor(attention), as_tensor(gradients)
    v = torch.as_tensor(readout_vector(layout), device=a.device)
    for layer in range(a.shape[0] - 1, -1, -1):
        m = g[layer].double().mul_(a[layer]).clamp_(min=0).mean(dim=0)
        v = v + v @ m
    return layout.patch_grid(to_host(v))


def class_gradient_rollout(model, images, layout: TokenLayout, target: int | None = None,
                           edit=None) -> tuple[np.ndarray, int]:
    """:func:`gradient_rollout` of :func:`attention_gradients`, without keeping either array.

    Each layer's mean_h((dy/dA * A)^+) (N x N, float64) is taken by a hook the moment backward
    reaches that layer's attention, so no gradient is retained and nothing is copied: beyond the
    attention the forward graph holds anyway, the extra memory is L N^2 float64 (2/H of the
    attention). Equal to the two-step computation to rounding.

    Args:
        model: a supported ViT (timm or transformers) with a classifier head.
        images: (1, 3, H, W) normalised input.
        layout: the token layout of that input.
        target: class index; default the top-1 class.
        edit: the adapters' ``edit=`` run in the same forward (a repair; ``layout`` is then the one it makes).

    Returns:
        (map (gh, gw), target class).
    """
    from ..adapters import adapter_for
    from ..types import to_model_input

    if adapter_for(model).num_classes(model) <= 0:
        raise ViewNotApplicable("Gradient-weighted rollout needs a classifier head; this model has none.")
    with torch.enable_grad():
        x = to_model_input(model, images).detach().requires_grad_(True)
        layers, logits = _attention_and_logits(model, x, edit)
        fused: list[torch.Tensor | None] = [None] * len(layers)
        for i, probs in enumerate(layers):
            # The hook holds a detached view, not ``probs`` itself: probs -> its hook -> probs would be a
            # reference cycle, and every image's attention would wait for the garbage collector.
            def weigh(grad, i=i, a=probs[0].detach()):
                fused[i] = grad[0].double().mul_(a).clamp_(min=0).mean(dim=0)
            probs.register_hook(weigh)
        target = int(logits[0].argmax()) if target is None else int(target)
        del layers
        logits[0, target].backward()
    v = torch.as_tensor(readout_vector(layout), device=fused[0].device)
    for m in reversed(fused):
        v = v + v @ m
    return layout.patch_grid(to_host(v)), target


def _attention_and_logits(model, x: torch.Tensor, edit=None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The attention of every layer [(B, H, N, N)] and the logits (B, C) of one forward, in one graph (gradients of
    the logits reach each layer's attention); ``edit``: the adapters' ``edit=`` (a repair)."""
    from ..lens import Lens

    trace = Lens.around(model).trace(x, ("blocks.*.attn", "logits"), edit=edit, grad=True)
    return trace.each("attn"), trace.logits


def gradient_rollout_reference(attention: np.ndarray, gradients: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """:func:`gradient_rollout` by its definition with full N x N products; the tests' reference."""
    R = np.eye(attention.shape[-1])
    for a, g in zip(attention, gradients):
        R = R + np.clip(g.astype(np.float64) * a, 0, None).mean(axis=0) @ R
    return layout.patch_grid(readout_row(R, layout))
