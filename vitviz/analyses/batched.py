"""The per-image analyses of a whole batch at once, in torch, on the device the attention is on.

:func:`reduce_attention` reads a batch's (B, L, H, N, N) attention once and returns every per-image reduction the
full analysis (``analyze``) and the statistics (``stats``) need: the mean attention distance in both prefix
conventions, the attention each token receives (sinks), the heads fused for rollout, and on request each head's
entropy, CLS focus and the attention patch queries give the prefix tokens. :func:`batch_rollout` then runs the rollout
of every image of the batch together (its cumulative steps included), and :func:`batch_sinks` /
:func:`batch_artifacts` turn the small results into the per-image sets. Only these results leave the device.

The numbers are those of the per-image functions (:mod:`vitviz.analyses.distance`, :mod:`~vitviz.analyses.tokens`,
:mod:`~vitviz.analyses.maps`, :mod:`~vitviz.analyses.rollout`) to float32 rounding: sums over keys are taken in the
attention's own precision (float32 matmuls and reductions, vectorised; float64 ones are several times slower on the
CPU) and combined in float64; rollout accumulates in float64 as :func:`~vitviz.analyses.rollout.rollout` does.

How the batch is walked depends on the device: on the CPU one image's layer (H, N, N) at a time (the temporaries stay
small: measured faster there than a whole layer of the batch at once, and 2x faster than the whole stack); on a GPU
one layer of the whole batch (B, H, N, N) at a time, a few kernels per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..layout import TokenLayout
from ..tensors import as_tensor, to_host
from .distance import patch_distances
from .maps import _entropy
from .rollout import FUSIONS, Rollout, _check_range, readout_index, readout_name, readout_vector
from .tokens import ARTIFACT_FACTOR, SINK_MIN_SHARE, SINK_Z, AttentionSinks, sinks_from_received

__all__ = ["Reductions", "reduce_attention", "batch_rollout", "rollouts", "batch_sinks", "batch_artifacts",
           "batch_gradient_rollout"]


@dataclass
class Reductions:
    """What :func:`reduce_attention` read from a batch's attention; tensors on the attention's device.

    Attributes:
        distance: (B, L, H) float64 mean attention distance in pixels, prefix keys dropped and rows renormalised
            (:data:`vitviz.analyses.distance.CONVENTION`, ``analyze``'s ``mean_distance_per_image``).
        distance_with_prefix: (B, L, H) float64 the same without renormalising (probing-vits' convention: attention on
            prefix tokens counts as distance 0).
        received: (B, L, N) float64 the mean share of a query's attention each token receives (mean over heads and
            all queries), what :func:`vitviz.analyses.tokens.attention_sinks` scores.
        fused: (B, L, N, N) the heads fused for rollout (``fusion``), in the attention's dtype; None unless asked.
        entropy: (B, L, H) float64 nats, :func:`vitviz.analyses.maps.head_entropy`; None unless ``scores``.
        cls_focus: (B, L, H) float64 in [0, 1], :func:`vitviz.analyses.maps.cls_focus`; None unless ``scores``.
        prefix_received: (B, L, H) float64 share of a patch query's attention on all prefix tokens together, averaged
            over patch queries; None unless ``scores``.
    """

    distance: torch.Tensor
    distance_with_prefix: torch.Tensor
    received: torch.Tensor
    fused: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    cls_focus: torch.Tensor | None = None
    prefix_received: torch.Tensor | None = None


def _fuse(block: torch.Tensor, fusion: str) -> torch.Tensor:
    """(..., H, N, N) -> (..., N, N): as :func:`vitviz.analyses.rollout.fuse_heads` (the same op, the same bits)."""
    return block.mean(dim=-3) if fusion == "mean" else getattr(block, "a" + fusion)(dim=-3)


@torch.inference_mode()
def reduce_attention(attention: torch.Tensor | np.ndarray, layout: TokenLayout, *, fusion: str | None = None,
                     scores: bool = False, images_per_block: int | None = None) -> Reductions:
    """Every per-image reduction of a batch's attention, in one pass over it, where it is.

    Args:
        attention: (B, L, H, N, N) softmax probabilities (rows sum to 1), a tensor on any device or numpy.
        layout: the token layout of the sequence.
        fusion: ``"mean"``, ``"max"`` or ``"min"``: also fuse the heads of every layer for :func:`batch_rollout`.
        scores: also each head's entropy, CLS focus and prefix share (the heads page's and ``stats``' scores).
        images_per_block: images read per step of each layer; default 1 on the CPU and the whole batch elsewhere.

    Returns:
        :class:`Reductions`, on the attention's device.
    """
    if fusion is not None and fusion not in FUSIONS:
        from ..errors import OptionError

        raise OptionError(f"head fusion must be one of {FUSIONS}, not {fusion!r}")
    a = as_tensor(attention)
    B, L, H, N, _ = a.shape
    ps, prefix = layout.patch_slice, slice(0, layout.num_prefix_tokens)
    P, device = layout.num_patches, a.device
    work = a.dtype if a.dtype in (torch.float32, torch.float64) else torch.float32  # bfloat16 sums in float32
    # [distance, 1] per (query, key): one batched product gives each query's distance-weighted mass and its mass.
    weights = torch.stack([torch.as_tensor(patch_distances(layout)), torch.ones(P, P, dtype=torch.float64)], dim=-1)
    weights = weights.to(device=device, dtype=work)
    ones = torch.ones(H * N, device=device, dtype=work)
    chunk = images_per_block or (B if device.type != "cpu" else 1)  # see the module's docstring
    sums = torch.empty(B, L, H, P, 2, device=device, dtype=work)
    received = torch.empty(B, L, N, device=device, dtype=work)
    fused = torch.empty(B, L, N, N, device=device, dtype=a.dtype) if fusion is not None else None
    if scores:
        entropy = torch.empty(B, L, H, device=device, dtype=torch.float64)
        focus = torch.full((B, L, H), float("nan"), device=device, dtype=torch.float64)
        prefix_share = torch.zeros(B, L, H, device=device, dtype=torch.float64)
    for b in range(0, B, chunk):
        for layer in range(L):
            block = a[b:b + chunk, layer]
            if block.dtype != work:
                block = block.to(work)
            sums[b:b + chunk, layer] = torch.einsum("bhqk,qkc->bhqc", block[..., ps, ps], weights)
            if fusion is not None:
                fused[b:b + chunk, layer] = _fuse(a[b:b + chunk, layer], fusion)
            if fusion == "mean" and a.dtype == work:  # sum_h sum_q a / (H N) = sum_q mean_h a / N: from the fused
                received[b:b + chunk, layer] = fused[b:b + chunk, layer].to(work).sum(dim=-2) * H
            else:
                received[b:b + chunk, layer] = ones @ block.reshape(-1, H * N, N)
            if scores:
                entropy[b:b + chunk, layer] = _entropy(block[..., ps, ps]).mean(dim=-1)
                if layout.has_class_token:
                    row = block[..., layout.cls_index, ps].double()
                    focus[b:b + chunk, layer] = 1 - _entropy(row) / np.log(P)
                if layout.num_prefix_tokens:
                    prefix_share[b:b + chunk, layer] = block[..., ps, prefix].sum(-1, dtype=torch.float64).mean(-1)
    weighted, mass = sums[..., 0].double(), sums[..., 1].double()
    result = Reductions(distance=(weighted / mass).mean(-1), distance_with_prefix=weighted.mean(-1),
                        received=received.double() / (H * N), fused=fused)
    if scores:
        result.entropy, result.cls_focus, result.prefix_received = entropy, focus, prefix_share
    return result


@torch.inference_mode()
def batch_rollout(fused: torch.Tensor, layout: TokenLayout, *, discard: float = 0.0, start: int = 0,
                  end: int | None = None, exclude_tokens: list[tuple[int, ...]] | None = None) -> torch.Tensor:
    """Attention rollout (:func:`vitviz.analyses.rollout.rollout`) of every image of a batch at once.

    The readout row of R = A'_end ... A'_start as row-vector chains, every image's advanced together: one (B, k, N) @
    (B, N, N) float64 product per layer, where A' = 0.5 A + 0.5 I (rows renormalised) of the fused heads with each
    image's ``exclude_tokens`` columns zeroed and, with ``discard``, the lowest fraction of its weights zeroed (never
    the readout's column).

    Args:
        fused: (B, L, N, N) the heads fused (:attr:`Reductions.fused`), any device.
        layout: token layout.
        discard: fraction in [0, 1) of the lowest fused weights zeroed per layer and image.
        start, end: layer range [start, end); default all layers.
        exclude_tokens: per image, token indices no mass may flow through; default none.

    Returns:
        (B, end - start, N) float64 on ``fused``'s device: row j is the readout after layers start..start+j.
    """
    from ..errors import OptionError

    if not 0 <= discard < 1:
        raise OptionError(f"discard ratio must be in [0, 1), not {discard}")
    B, L, N, _ = fused.shape
    end = _check_range(L, start, end)
    device = fused.device
    keep = readout_index(layout)
    e = torch.as_tensor(readout_vector(layout), device=device).expand(B, 1, N)
    kept = torch.ones(B, N, 1, dtype=torch.float64, device=device)  # per image, 0 on the excluded tokens
    for i, tokens in enumerate(exclude_tokens or []):
        if tokens:
            kept[i, list(tokens)] = 0
    excluding = bool(exclude_tokens) and any(exclude_tokens)
    chains = e.new_empty((B, 0, N))
    # A' = D^-1 (0.5 F K + 0.5 I), K the kept columns, D its row sums: c A' = 0.5 ((c D^-1) F) K + 0.5 c D^-1, so the
    # step is never formed: one float64 copy of F, its row sums over the kept columns, and the product. The copy
    # reuses one buffer for every layer (fresh memory on the CPU costs a page fault per 4 KiB).
    f64 = torch.empty((B, N, N), dtype=torch.float64, device=device)
    for layer in range(end - 1, start - 1, -1):
        f = fused[:, layer]
        if discard:
            f = _discard_lowest(f, discard, keep)
        f = f64.copy_(f)
        rows = (f @ kept if excluding else f.sum(dim=-1, keepdim=True)).mul_(0.5).add_(0.5)  # (B, N, 1)
        scaled = torch.cat([chains, e], dim=1) / rows.transpose(1, 2)
        product = scaled @ f
        if excluding:
            product.mul_(kept.transpose(1, 2))
        chains = product.mul_(0.5).add_(scaled, alpha=0.5)
    return chains.flip(1)


def _discard_lowest(fused: torch.Tensor, fraction: float, keep_column: int | None) -> torch.Tensor:
    """:func:`vitviz.analyses.rollout.discard_lowest` of each (N, N) of a (B, N, N) batch: per image, the lowest
    ``fraction`` of the weights outside ``keep_column`` zeroed."""
    B, N, _ = fused.shape
    candidates = N * (N - 1) if keep_column is not None else N * N
    k = int(fraction * candidates)
    if not k:
        return fused
    ranked = fused.clone()
    if keep_column is not None:
        ranked[:, :, keep_column] = float("inf")  # never among the lowest
    lowest = torch.topk(ranked.reshape(B, N * N), k, dim=1, largest=False, sorted=False).indices
    return fused.reshape(B, N * N).scatter(1, lowest, 0).reshape(B, N, N)


def rollouts(rows: torch.Tensor | np.ndarray, layout: TokenLayout, start: int = 0) -> list[Rollout]:
    """Per image, the :class:`vitviz.analyses.rollout.Rollout` of :func:`batch_rollout`'s (B, n, N) rows."""
    rows = rows if isinstance(rows, np.ndarray) else to_host(rows)
    per_layer = layout.patch_grid(rows)
    layers, readout = (start, start + rows.shape[1]), readout_name(layout)
    return [Rollout(map=p[-1], per_layer=p, layers=layers, readout=readout,
                    prefix_share={name: float(r[-1, i]) for i, name in enumerate(layout.prefix_tokens)})
            for p, r in zip(per_layer, rows)]


def batch_sinks(received: torch.Tensor | np.ndarray, layout: TokenLayout, z_threshold: float = SINK_Z,
                min_share: float = SINK_MIN_SHARE) -> list[AttentionSinks]:
    """Per image, :func:`vitviz.analyses.tokens.attention_sinks` from :attr:`Reductions.received` (B, L, N): the
    robust z-scores are medians of L x N numbers per image, taken on the host."""
    received = received if isinstance(received, np.ndarray) else to_host(received)
    return [sinks_from_received(r, layout, z_threshold, min_share) for r in received]


def batch_artifacts(norms: torch.Tensor | np.ndarray, layout: TokenLayout,
                    factor: float = ARTIFACT_FACTOR) -> list[np.ndarray]:
    """Per image, :func:`vitviz.analyses.tokens.artifact_tokens` of the last layer's token norms (B, L, N)."""
    from .tokens import artifact_tokens

    norms = norms if isinstance(norms, np.ndarray) else to_host(norms)
    return [artifact_tokens(n[-1], layout, factor) for n in norms]


def batch_gradient_rollout(model, inputs: torch.Tensor, layout: TokenLayout, target: int | None = None,
                           edit=None, images_per_pass: int | None = None) -> tuple[np.ndarray, list[int]]:
    """:func:`vitviz.analyses.rollout.class_gradient_rollout` of every image of a batch, in one forward and one
    backward.

    Each image's logit depends on that image alone, so the gradient of the sum of every image's target logit is, at
    each image's attention, that image's own gradient. A backward hook takes each layer's mean_h((dy/dA * A)^+)
    (B, N, N) in float64 the moment backward reaches it; the readout rows v <- v + v M_l, from the last layer down,
    run as one (B, 1, N) @ (B, N, N) product per layer.

    Args:
        model: a model an adapter reads, with a classifier head.
        inputs: (B, 3, H, W) normalised input.
        layout: the token layout of that input.
        target: class index for every image; default each image's top-1.
        edit: the adapters' ``edit=`` run in the same forward (a repair; ``layout`` is then the one it makes).
        images_per_pass: images per forward and backward; default as many as keep the graph's attention under
            :data:`GRADIENT_PASS_BYTES` (a GPU: a quarter of its free memory).

    Returns:
        maps (B, gh, gw) float64 and each image's target class.
    """
    per_pass = images_per_pass or _images_per_pass(model, inputs, layout)
    maps, targets = [], []
    for i in range(0, len(inputs), per_pass):
        m, t = _gradient_rollout_pass(model, inputs[i:i + per_pass], layout, target, edit)
        maps.append(m)
        targets += t
    return np.concatenate(maps), targets


GRADIENT_PASS_BYTES = 2 ** 30  # the CPU's share for one gradient pass's attention-sized tensors


def _images_per_pass(model, inputs: torch.Tensor, layout: TokenLayout) -> int:
    """Images per gradient pass: the graph keeps each layer's (H, N, N) attention and softmax, and backward adds its
    gradient and the float64 product, ~20 bytes per weight per image; bounded by :data:`GRADIENT_PASS_BYTES` on the
    CPU and by a quarter of the free memory on a GPU."""
    from ..adapters import adapter_for

    adapter = adapter_for(model)
    device = next(model.parameters()).device
    layers = adapter.num_layers(model)
    per_image = 20 * sum(adapter.num_heads(model, i) for i in range(layers)) * layout.num_tokens ** 2
    budget = torch.cuda.mem_get_info(device)[0] // 4 if device.type == "cuda" else GRADIENT_PASS_BYTES
    return max(1, min(len(inputs), int(budget // per_image)))


def _gradient_rollout_pass(model, inputs: torch.Tensor, layout: TokenLayout, target: int | None,
                           edit) -> tuple[np.ndarray, list[int]]:
    from ..adapters import adapter_for, run
    from ..errors import ViewNotApplicable
    from ..types import to_model_input

    adapter = adapter_for(model)
    if adapter.num_classes(model) <= 0:
        raise ViewNotApplicable("Gradient-weighted rollout needs a classifier head; this model has none.")
    with torch.enable_grad():
        x = to_model_input(model, inputs).detach().requires_grad_(True)
        out = run(model, x, keep=("blocks.*.attn", "logits"), edit=edit)
        layers = [out.pop(f"blocks.{i}.attn") for i in range(adapter.num_layers(model))]
        logits = out.pop("logits")
        fused: list[torch.Tensor | None] = [None] * len(layers)
        for i, probs in enumerate(layers):
            # A detached view, not ``probs``: probs -> its hook -> probs would be a reference cycle.
            def weigh(grad, i=i, a=probs.detach()):
                fused[i] = grad.double().mul_(a).clamp_(min=0).mean(dim=1)
            probs.register_hook(weigh)
        B = logits.shape[0]
        targets = (logits.argmax(dim=-1) if target is None
                   else torch.full((B,), int(target), device=logits.device, dtype=torch.long))
        del layers, out
        logits.gather(1, targets[:, None]).sum().backward()
    v = torch.as_tensor(readout_vector(layout), device=fused[0].device).expand(B, 1, -1)
    for m in reversed(fused):
        v = v + v @ m
    return layout.patch_grid(to_host(v[:, 0])), targets.tolist()
