"""Attention rollout (Abnar & Zuidema 2020): :func:`vitviz.analyses.rollout.rollout` of every image."""
import numpy as np

from ..analyses.rollout import rollout
from .base import Map, MapMethod, attention_of, register_method


@register_method
class Rollout(MapMethod):
    """Options: ``fusion`` (mean / max / min), ``discard`` (0..1), ``start``, ``end`` (0-based layer range, end
    exclusive), ``exclude_tokens``, ``query`` (a patch's raster index instead of the readout)."""

    name, label, kind = "rollout", "rollout", "attention"
    needs = ("attention",)
    summary = "attention rolled out through the layers (heads fused, residual added, rows renormalised)"

    def compute(self, lens, x, target=None, trace=None, **options):
        attention = attention_of(lens, x, trace)
        layout = lens.layout_for(x)
        maps = np.stack([rollout(a, layout, **options).map for a in attention])
        return Map(self.name, maps, settings={"method": self.name, "options": options, "target": None})
