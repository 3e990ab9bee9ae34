"""Attention flow (Abnar & Zuidema 2020): max-flow from every patch to the readout, :mod:`vitviz.analyses.flow`."""
import numpy as np

from ..analyses.flow import attention_flow
from .base import Map, MapMethod, attention_of, register_method


@register_method
class AttentionFlow(MapMethod):
    """Options: those of rollout (``fusion``, ``discard``, ``start``, ``end``, ``exclude_tokens``, ``query``),
    ``scale`` (integer capacities) and ``progress(done, total)``. One max-flow per patch: slow on large grids."""

    name, label, kind = "attention_flow", "attention flow", "attention"
    needs = ("attention",)
    summary = "the maximum flow from each patch to the readout through the attention graph (slow: one flow per patch)"

    def compute(self, lens, x, target=None, trace=None, **options):
        attention = attention_of(lens, x, trace)
        layout = lens.layout_for(x)
        maps = np.stack([attention_flow(a.astype(np.float64), layout, **options).map for a in attention])
        kept = {k: v for k, v in options.items() if k != "progress"}
        return Map(self.name, maps, settings={"method": self.name, "options": kept, "target": None})
