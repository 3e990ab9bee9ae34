"""Pieces of the spelled-out forward that every family writes the same way: scaled dot-product
attention and the usual MLPs, each calling the named points of :mod:`vitviz.adapters.base`."""
from __future__ import annotations

import torch

from .base import Hooks, Rules, point_name


def attention(hooks: Hooks, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              bias: torch.Tensor | None = None, scale_after: bool = False) -> torch.Tensor:
    """softmax(q kᵀ · scale + bias) @ v with the points ``q``, ``k``, ``v``, ``scores``, ``attn``, ``z``.

    q, k, v: (B, H, N, d) (key/value heads already repeated for grouped-query attention);
    bias: broadcastable to (B, H, N, N), added to the scaled scores (position bias, masks) or None;
    scale_after: multiply the product q kᵀ by the scale (transformers' eager attention) instead of q
        before it (timm): the same function, rounded as the library rounds it.
    Returns the heads' context concatenated, (B, N, H * d), in v's dtype.
    """
    B, H, N, _ = q.shape
    q, k, v = hooks(point_name("q", layer), q), hooks(point_name("k", layer), k), hooks(point_name("v", layer), v)
    if _by_image(hooks, layer, q, k, v):
        return _attention_by_image(hooks, layer, q, k, v, scale, bias, scale_after)
    qs, kt = hooks.rules.bilinear(q if scale_after else q * scale, k.transpose(-2, -1))
    scores = qs @ kt * scale if scale_after else qs @ kt
    if bias is not None:
        scores = scores + bias
    scores = hooks(point_name("scores", layer), scores)
    probs = hooks(point_name("attn", layer), hooks.rules.softmax(scores))
    a, vv = hooks.rules.bilinear(probs.to(v.dtype), v)
    z = hooks(point_name("z", layer), a @ vv)
    return z.transpose(1, 2).reshape(B, N, -1)


def _by_image(hooks: Hooks, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`attention` may run image by image: on the CPU, without a graph, with the model's own rules, in
    float32 or float64, and nobody reading or changing the scores (they never exist as one (B, H, N, N) tensor)."""
    return (q.device.type == "cpu" and type(hooks.rules) is Rules and q.dtype in (torch.float32, torch.float64)
            and q.dtype == k.dtype == v.dtype
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and not hooks.wants(point_name("scores", layer)))


def _attention_by_image(hooks: Hooks, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        bias: torch.Tensor | None, scale_after: bool) -> torch.Tensor:
    """:func:`attention` one image at a time, the same products and softmax (the same bits): one image's (H, N, N)
    scores live in a buffer reused for every image, so the batch's scores and probabilities are never allocated
    (on the CPU, fresh memory costs a page fault per 4 KiB; the fused forward never forms them). The probabilities
    are written once, where an observer keeps them (a trace's stack) or into one (B, H, N, N) tensor when the point
    is read; while one image's are still in the cache they are multiplied by v, unless an edit may change them."""
    B, H, N, d = q.shape
    name = point_name("attn", layer)
    qs, kt = q if scale_after else q * scale, k.transpose(-2, -1)
    scores = q.new_empty((H, N, N))
    if hooks.wants(name):
        probs = hooks.destination(name, (B, H, N, N), q.dtype, q.device)
        probs = q.new_empty((B, H, N, N)) if probs is None else probs
    else:
        probs = None
    edited = hooks.edits(name)
    bias = None if bias is None else torch.broadcast_to(bias, (B, H, N, N))
    z = v.new_empty((B, H, N, v.shape[-1]))
    for b in range(B):
        torch.matmul(qs[b], kt[b], out=scores)
        if scale_after:
            scores.mul_(scale)
        if bias is not None:
            scores.add_(bias[b])
        p = torch.softmax(scores, dim=-1, out=scores if probs is None else probs[b])
        if not edited:
            torch.matmul(p, v[b], out=z[b])
    if probs is not None:
        probs = hooks(name, probs)
    if edited:
        for b in range(B):
            torch.matmul(probs[b], v[b], out=z[b])
    z = hooks(point_name("z", layer), z)
    return z.transpose(1, 2).reshape(B, N, -1)


def _timm_mlp(hooks: Hooks, layer: int, mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """timm ``Mlp``, ``GluMlp`` (``SwiGLUPacked``) and ``SwiGLU`` spelled out; None for another class."""
    from timm.layers import GluMlp, Mlp, SwiGLU

    rules = hooks.rules
    if type(mlp) is Mlp:
        h = rules.act(mlp.act, mlp.fc1(x))
    elif type(mlp) is GluMlp:
        x1, x2 = mlp.fc1(x).chunk(2, dim=mlp.chunk_dim)
        a, b = (x1, rules.act(mlp.act, x2)) if mlp.gate_last else (rules.act(mlp.act, x1), x2)
        a, b = rules.bilinear(a, b)
        h = a * b
    elif type(mlp) is SwiGLU:
        a, b = rules.bilinear(rules.act(mlp.act, mlp.fc1_g(x)), mlp.fc1_x(x))
        h = a * b
    else:
        return None
    h = hooks(point_name("mlp_hidden", layer), h)
    norm = mlp.norm
    h = h if isinstance(norm, torch.nn.Identity) else rules.norm(norm, h)
    return mlp.fc2(h)


def mlp(hooks: Hooks, layer: int, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A block's MLP with the point ``mlp_hidden`` (after the activation) where its class is spelled out
    here; another class runs as its own module (and has no ``mlp_hidden`` point)."""
    out = _timm_mlp(hooks, layer, module, x)
    return module(x) if out is None else out


def norm(hooks: Hooks, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A norm module through the run's rules (an Identity stays the identity)."""
    return x if isinstance(module, torch.nn.Identity) else hooks.rules.norm(module, x)


def block_mismatch(where: str, blk: torch.nn.Module, blocks: tuple[type, ...], attentions: tuple[type, ...]) -> str | None:
    """Why a block is not one the adapter's forward rewrites ("block 3 is a Block with Attention2 attention"), or None
    when ``blk`` and its ``attn`` are exactly of the listed classes (subclasses may change the forward)."""
    attn = getattr(blk, "attn", None)
    if type(blk) in blocks and type(attn) in attentions:
        return None
    inside = f" with {type(attn).__name__} attention" if attn is not None else " without one attention module"
    return f"{where} is a {type(blk).__name__}{inside}"
