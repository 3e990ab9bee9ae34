"""Attention flow (Abnar & Zuidema 2020), the max-flow companion of rollout, solved exactly.

The layered graph: one node per token after each layer of the range, an edge from token i
below to token j above with capacity A'[j, i], where A' is the layer's head-fused attention with
the residual, 0.5 A + 0.5 I and rows renormalised (the same step as rollout). The attribution of
input patch p is the maximum flow from p at the bottom to the readout at the top: the CLS token,
or for models without CLS a virtual readout attending 1/P to every top patch (the flow analogue
of rollout's mean over patch rows).

Exactness and scaling: ``scipy.sparse.csgraph.maximum_flow`` solves integer networks, so every
capacity c is scaled by S = ``scale`` and rounded *down*, c_int = floor(S c). The integer
problem is solved exactly (Dinic). Rounding down can only lower a cut, so the reported value
F = flow_int / S never exceeds the true flow; and the true flow is at most the true capacity of
the integer problem's minimum cut C', which exceeds S⁻¹ flow_int by less than |C'| / S (|C'| =
edges crossing C'). Each patch's value therefore lies in [F, F + |C'|/S]; the bound is computed
per patch from the residual graph and returned as ``error_bound``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from ..errors import OptionError
from ..layout import TokenLayout
from .rollout import discard_lowest, fuse_heads, readout_index, readout_name, readout_vector, rollout_step

# 2**24: capacities up to 1 stay well inside int32 (the flow into the readout is at most ~S),
# and the rounding error per cut edge is below 6e-8.
DEFAULT_SCALE = 2 ** 24
FLOW_DEFINITION = ("max-flow from each input patch to the readout (CLS, or a virtual token attending 1/P to every "
                   "top patch) through the layered token graph; capacities per layer: head-fused attention, "
                   "discard, 0.5 A + 0.5 I, rows renormalised (as rollout); capacities scaled by S and rounded "
                   "down, so the true flow lies in [value, value + error_bound] with error_bound = edges of the "
                   "minimum cut / S")


@dataclass
class AttentionFlow:
    """Result of :func:`attention_flow`.

    Attributes:
        map: (gh, gw) max-flow value from each input patch to the readout (capacity units: attention mass).
        error_bound: (gh, gw) the true flow lies in [map, map + error_bound] (integer scaling, see module doc).
        layers: (start, end) layer range used, end exclusive, 0-based.
        readout: ``"cls"`` or ``"mean over patch rows"``.
        scale: the integer scale S of the capacities.
    """

    map: np.ndarray
    error_bound: np.ndarray
    layers: tuple[int, int]
    readout: str
    scale: int


def layer_capacities(attention: np.ndarray, layout: TokenLayout, *, fusion: str = "mean", discard: float = 0.0,
                     start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = (),
                     query: int | None = None) -> list[np.ndarray]:
    """The per-layer matrices A' of the range, exactly as rollout builds them (the readout's column, CLS or patch
    ``query``, never discarded): (L, H, N, N) -> [(N, N)] * (end - start)."""
    L = attention.shape[0]
    end = L if end is None else end
    if not 0 <= start < end <= L:
        raise OptionError(f"layer range must satisfy 0 <= start < end <= {L}, got ({start}, {end})")
    return [rollout_step(discard_lowest(fuse_heads(attention[layer], fusion), discard, readout_index(layout, query)),
                         exclude_tokens) for layer in range(start, end)]


class FlowNetwork:
    """The layered graph of a stack of A' matrices, built once; one max-flow per source patch.

    The edges are the matrices ``A'_1, ..., A'_K`` followed by the readout: for a CLS readout the
    last matrix is cut to its CLS row (the CLS node after the last layer *is* the sink; the other
    top tokens are dead ends and left out), otherwise one more layer of edges carries each top
    patch into the sink with capacity 1/P. Nodes: N per hidden layer (node ``t * N + j`` = token j
    after the (t+1)-th matrix), then the source (the input token: its outgoing capacities are
    rewritten per patch, column p of the first matrix), then the sink.

    Args:
        capacities: K matrices (N, N), A'[j, i] = capacity from token i below to token j above.
        readout: (N,) weights of the top tokens in the readout: one-hot CLS, or 1/P on patches.
        scale: integer scale S of the capacities.
    """

    def __init__(self, capacities: list[np.ndarray], readout: np.ndarray, scale: int = DEFAULT_SCALE):
        readout = np.asarray(readout, dtype=np.float64)
        mats = [np.asarray(c, dtype=np.float64) for c in capacities]
        if np.count_nonzero(readout) == 1:
            mats[-1] = mats[-1][np.flatnonzero(readout)]
        else:
            mats.append(readout[None])
        mats = [np.floor(m * scale).astype(np.int64) for m in mats]
        if max(int(m.max()) for m in mats) >= 2 ** 31:
            raise ValueError(f"capacity scale {scale} overflows int32; use a smaller scale")
        N, hidden = mats[0].shape[1], len(mats) - 1
        self.scale = int(scale)
        self.source, self.sink = hidden * N, hidden * N + 1

        def nodes(t):  # the nodes after the (t+1)-th matrix
            return t * N + np.arange(N) if t < hidden else np.array([self.sink])

        rows, cols, data = [np.full(mats[0].shape[0], self.source)], [nodes(0)], [np.ones(mats[0].shape[0], np.int64)]
        for t in range(1, len(mats)):
            j, i = np.nonzero(mats[t])
            rows.append((t - 1) * N + i)
            cols.append(nodes(t)[j])
            data.append(mats[t][j, i])
        n = hidden * N + 2
        graph = csr_matrix((np.concatenate(data).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))),
                           shape=(n, n))
        graph.sort_indices()
        self.graph = graph
        self.first = mats[0]
        start = graph.indptr[self.source]
        self._source_slots = slice(start, start + mats[0].shape[0])
        self._source_rows = nodes(0).searchsorted(graph.indices[self._source_slots]) if hidden else \
            np.zeros(1, dtype=int)
        self._edge_tail = np.repeat(np.arange(n), np.diff(graph.indptr))

    @property
    def edges(self) -> int:
        return int(self.graph.nnz)

    def flow_from(self, token: int) -> tuple[float, float]:
        """(max-flow value, error bound) from input token ``token`` to the readout, in capacity units."""
        self.graph.data[self._source_slots] = self.first[self._source_rows, token]
        result = maximum_flow(self.graph, self.source, self.sink, method="dinic")
        return result.flow_value / self.scale, self._cut_edges(result.flow) / self.scale

    def _cut_edges(self, flow) -> int:
        """Edges with positive capacity leaving the set reachable from the source in the residual graph."""
        residual = self.graph - flow.tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = np.zeros(self.graph.shape[0], dtype=bool)
        reached[breadth_first_order(residual, self.source, directed=True, return_predecessors=False)] = True
        g = self.graph
        return int(((g.data > 0) & reached[self._edge_tail] & ~reached[g.indices]).sum())


def attention_flow(attention: np.ndarray, layout: TokenLayout, *, fusion: str = "mean", discard: float = 0.0,
                   start: int = 0, end: int | None = None, exclude_tokens: tuple[int, ...] = (),
                   scale: int = DEFAULT_SCALE, progress: Callable[[int, int], None] | None = None,
                   query: int | None = None) -> AttentionFlow:
    """Attention flow of one image: max-flow from every input patch to the readout.

    Args:
        attention: (L, H, N, N) attention probabilities.
        layout: token layout.
        fusion, discard, start, end, exclude_tokens: as in :func:`vitviz.analyses.rollout.rollout`.
        scale: integer scale of the capacities (see the module docstring for the error bound).
        progress: called with (patches done, patches) after each patch.
        query: flow into patch ``query``'s token at the top (raster order, 0-based: a clicked patch, as rollout's
            ``query``) instead of the model's readout.

    Returns:
        AttentionFlow with map and error_bound (gh, gw).
    """
    caps = layer_capacities(attention, layout, fusion=fusion, discard=discard, start=start, end=end,
                            exclude_tokens=exclude_tokens, query=query)
    network = FlowNetwork(caps, readout_vector(layout, query), scale)
    P, offset = layout.num_patches, layout.num_prefix_tokens
    values, bounds = np.zeros(P), np.zeros(P)
    for p in range(P):
        values[p], bounds[p] = network.flow_from(offset + p)
        if progress is not None:
            progress(p + 1, P)
    end = attention.shape[0] if end is None else end
    return AttentionFlow(map=layout.to_grid(values), error_bound=layout.to_grid(bounds), layers=(start, end),
                         readout=readout_name(layout, query), scale=int(scale))
