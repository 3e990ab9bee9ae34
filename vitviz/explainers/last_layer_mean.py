"""The last layer's raw readout attention (the CLS row, or the mean patch row), mean over heads."""
import numpy as np

from ..perturbation.curves import readout_query
from ..analyses.maps import query_attention_map
from .base import Map, MapMethod, attention_of, register_method


@register_method
class LastLayerMean(MapMethod):
    name, label, kind = "last_layer_mean", "last layer, mean of heads", "attention"
    needs = ("attention",)
    summary = "the readout's raw attention over the patches in the last layer, mean over heads"

    def compute(self, lens, x, target=None, trace=None, **options):
        attention = attention_of(lens, x, trace)
        layout = lens.layout_for(x)
        query = readout_query(layout)
        maps = np.stack([np.stack([query_attention_map(a, layout, -1, h, query) for h in range(a.shape[1])]).mean(0)
                         for a in attention])
        return Map(self.name, maps, settings={"method": self.name, "query": query, "target": None})
