"""The chance floor: a seeded random map (uniform values, the same for every image of a batch)."""
import numpy as np

from ..perturbation.curves import random_map
from .base import Map, MapMethod, register_method


@register_method
class RandomMap(MapMethod):
    """Options: ``seed`` (default 0)."""

    name, label, kind = "random", "random", "baseline"
    summary = "a seeded random map: the floor every method must beat"

    def compute(self, lens, x, target=None, trace=None, seed: int = 0):
        layout = lens.layout_for(x)
        grid = random_map(layout.grid_size, seed)
        return Map(self.name, np.stack([grid] * len(x)), settings={"method": self.name, "seed": seed, "target": None})
