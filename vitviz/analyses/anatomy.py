"""One attention row taken apart: q, the scores q·k, the 1/sqrt(d) scaling, the softmax, the weighted values.

The queries, keys and values are recomputed from the block's own input with the block's own
modules, along the path a trace takes (the family adapter's ``layer_qkv``: ``norm1``, the
projections, ``q_norm``/``k_norm``, the rotary embedding of EVA-02 and rotary ViTs), so the row
shown here is the row that a trace keeps. BEiT's
relative position bias is the one term not in q·k: it is kept as ``bias`` and added to the scaled
scores, exactly as the model adds it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..adapters import adapter_for, point_name
from ..errors import OptionError
from ..layout import TokenLayout
from ..lens import Lens
from ..types import to_model_input


def _check_layer(model, layer: int) -> None:
    depth = adapter_for(model).num_layers(model)
    if not 0 <= layer < depth:
        raise OptionError(f"layer {layer + 1} is outside the model's {depth} layers")


@torch.inference_mode()
def block_output(model, images: torch.Tensor, layer: int) -> torch.Tensor:
    """The tokens leaving block ``layer`` (0-based; before the final norm): (B, 3, H, W) -> (B, N, D).

    In the model's dtype and on its device; the blocks after ``layer`` are not run.
    """
    _check_layer(model, layer)
    name = point_name("resid_post", layer)
    return Lens.around(model).trace(to_model_input(model, images), keep=(name,), stop_after=name, grad=None)[name]


@torch.inference_mode()
def block_input(model, images: torch.Tensor, layer: int) -> torch.Tensor:
    """The tokens entering block ``layer`` (0-based): (B, 3, H, W) -> (B, N, D)."""
    _check_layer(model, layer)
    name = point_name("resid_pre", layer)
    return Lens.around(model).trace(to_model_input(model, images), keep=(name,), stop_after=name, grad=None)[name]


@dataclass
class LayerQKV:
    """Queries, keys and values of every head of one layer, for one image.

    Attributes:
        q, k, v: (H, N, d_head) float64, q and k after the block's ``q_norm``/``k_norm``.
        scale: the factor the block multiplies the scores by (1/sqrt(d_head) unless the model says otherwise).
        steps: the block's extra steps in words (query/key norm, rotary embedding, relative position bias,
            output norm, gate), in order.
        bias: (H, N, N) float64 added to the scaled scores (BEiT's relative position bias), or None.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    steps: list[str]
    bias: np.ndarray | None = None

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]


@torch.inference_mode()
def layer_qkv(model, images: torch.Tensor, layer: int) -> LayerQKV:
    """q, k, v of layer ``layer`` (0-based) for a batch of one image: (1, 3, H, W) -> :class:`LayerQKV`."""
    if images.shape[0] != 1:
        raise ValueError(f"layer_qkv takes one image, got a batch of {images.shape[0]}")
    _check_layer(model, layer)

    def arr(t: torch.Tensor | None) -> np.ndarray | None:
        return None if t is None else t[0].detach().double().cpu().numpy()

    x = to_model_input(model, images)
    q, k, v, scale, steps, bias = adapter_for(model).layer_qkv(model, x, layer)
    return LayerQKV(q=arr(q), k=arr(k), v=arr(v), scale=scale, steps=list(steps), bias=arr(bias))


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


@dataclass
class AttentionAnatomy:
    """The steps of one query's attention in one head, with the model's numbers.

    Attributes:
        head, query: 0-based head and query token (index into the full sequence).
        q: (d,) the query vector.
        scores: (N,) q·k_j for every token j, before scaling.
        scale: the scaling factor (1/sqrt(d_head)).
        bias: (N,) the relative position bias this query's scores get (BEiT), zeros for other families.
        scaled: (N,) scores x scale + bias — the logits the softmax sees.
        unscaled_weights: (N,) softmax(scores + bias): what the row would be without the scaling.
        weights: (N,) softmax(scaled): the attention row.
        values: (N, d) the value vectors.
        contributions: (N, d) weights[j] x v_j.
        output: (d,) sum of the contributions: this head's output for the query, before the projection.
    """

    head: int
    query: int
    q: np.ndarray
    scores: np.ndarray
    scale: float
    bias: np.ndarray
    scaled: np.ndarray
    unscaled_weights: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    contributions: np.ndarray
    output: np.ndarray

    def entropy(self, weights: np.ndarray) -> float:
        """Entropy of a row in nats (ln N for uniform attention, 0 for one token)."""
        p = weights[weights > 0]
        return float(-(p * np.log(p)).sum())

    def top_contributors(self, k: int = 10) -> np.ndarray:
        """Token indices of the ``k`` largest weights, largest first."""
        return np.argsort(-self.weights, kind="stable")[:k]

    def tokens_worth(self, weights: np.ndarray) -> float:
        """exp(entropy): how many tokens' worth of attention a row spreads over (N for uniform, 1 for one token)."""
        return float(np.exp(self.entropy(weights)))

    @property
    def scores_times_scale(self) -> np.ndarray:
        """(N,) the scores times 1/sqrt(d), before any relative position bias."""
        return self.scores * self.scale

    @property
    def output_shares(self) -> np.ndarray:
        """(N,) each token's share of the output: (w_j v_j · output) / ‖output‖², summing to 1 (0 for a zero output)."""
        return self.contributions @ self.output / max(float(self.output @ self.output), 1e-30)

    @property
    def uniform_entropy(self) -> float:
        """ln N: the entropy of a row spread evenly over all N tokens."""
        return float(np.log(len(self.scores)))

    @property
    def q_norm(self) -> float:
        return float(np.linalg.norm(self.q))

    @property
    def output_norm(self) -> float:
        return float(np.linalg.norm(self.output))

    @property
    def contribution_norms(self) -> np.ndarray:
        """(N,) ‖w_j v_j‖."""
        return np.linalg.norm(self.contributions, axis=1)

    @property
    def value_norms(self) -> np.ndarray:
        """(N,) ‖v_j‖."""
        return np.linalg.norm(self.values, axis=1)

    def held_by(self, tokens) -> tuple[float, float]:
        """The share of the weight and the share of the output (:attr:`output_shares`) that ``tokens`` (sequence
        indices, or a slice) hold together."""
        return float(self.weights[tokens].sum()), float(self.output_shares[tokens].sum())

    def patch_row(self, layout: TokenLayout) -> np.ndarray:
        """(1, gh, gw) float32 the attention row over the patches, as the heads page draws it."""
        return layout.patch_grid(self.weights.astype(np.float32))[None]


def span(values: np.ndarray) -> tuple[float, float, float]:
    """(lowest, highest, highest - lowest) of ``values``."""
    lo, hi = float(np.min(values)), float(np.max(values))
    return lo, hi, hi - lo


def attention_anatomy(qkv: LayerQKV, head: int, query: int) -> AttentionAnatomy:
    """Take apart the attention of token ``query`` in ``head`` (both 0-based) of one layer."""
    H, N, _ = qkv.q.shape
    if not 0 <= head < H:
        raise OptionError(f"head {head + 1} is outside the layer's {H} heads")
    if not 0 <= query < N:
        raise OptionError(f"token {query} is outside the sequence of {N} tokens")
    q, keys, values = qkv.q[head, query], qkv.k[head], qkv.v[head]
    scores = keys @ q
    bias = np.zeros(N) if qkv.bias is None else qkv.bias[head, query]
    scaled = scores * qkv.scale + bias
    weights = softmax(scaled)
    contributions = weights[:, None] * values
    return AttentionAnatomy(head=head, query=query, q=q, scores=scores, scale=qkv.scale, bias=bias, scaled=scaled,
                            unscaled_weights=softmax(scores + bias), weights=weights, values=values,
                            contributions=contributions, output=contributions.sum(axis=0))
