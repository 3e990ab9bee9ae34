"""Colour maps and colour scales: the one place that turns values into colours.

Colour maps are exactly plotly's named scales (the reference stops, never altered); maps are
coloured here, as RGB(A) pixels, so no front-end theme can swap a stop. A :class:`ColourScale`
says which values the colours span and what was clipped, so every figure can state it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import OptionError

# Perceptually uniform maps for magnitudes; the diverging one is for signed values (cosine).
SEQUENTIAL = ("Inferno", "Viridis", "Magma", "Cividis", "Greys")
DIVERGING = "RdBu_r"
SCALE_MODES = ("robust per head", "shared across heads", "log", "full range per map")
ROBUST_PERCENTILE = 99.0
# A map whose values all lie within this share of their mean shows no pattern (a random or untrained head's
# near-uniform attention): a per-map scale would stretch its 1e-9 ripples to the full colour range.
FLAT_RELATIVE = 1e-3
FLAT_RULE = (f"flat: every value within {FLAT_RELATIVE:.1%} of the map's mean, drawn at mid-scale "
             "(0 to twice the mean), not stretched")


def reference_stops(name: str) -> list[list]:
    """Plotly's own stops of a named colour scale: [[position, "rgb(r, g, b)"], ...].

    ``"RdBu_r"`` is RdBu reversed (blue for -1, red for +1), as plotly names it.
    """
    from plotly.colors import get_colorscale, hex_to_rgb, label_rgb

    stops = get_colorscale(name)
    return [[float(p), c if c.startswith("rgb") else label_rgb(hex_to_rgb(c))] for p, c in stops]


@lru_cache(maxsize=16)
def lookup_table(name: str = "Inferno") -> np.ndarray:
    """(256, 3) uint8: the named scale sampled at 256 even positions (linear between stops)."""
    from plotly.colors import sample_colorscale, unlabel_rgb

    colours = sample_colorscale(reference_stops(name), list(np.linspace(0, 1, 256)))
    return np.array([unlabel_rgb(c) for c in colours], dtype=np.float64).round().astype(np.uint8)


@dataclass(frozen=True)
class ColourScale:
    """The values the colours span.

    Attributes:
        lo, hi: values at the bottom and the top colour (log10 of them when ``log``).
        log: colours follow log10 of the values.
        signed: the scale of a signed map (relevance): symmetric about 0 (``lo == -hi``), clipped at both ends.
        rule: how lo/hi were chosen, in words, for captions and settings files.
    """

    lo: float
    hi: float
    log: bool = False
    rule: str = ""
    flat: bool = False
    signed: bool = False  # a signed map's scale: lo = -hi, coloured on DIVERGING with 0 at its centre

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Values -> [0, 1] positions on the colour map (clipped at both ends; NaN stays NaN)."""
        v = np.asarray(values, dtype=np.float64)
        if self.log:
            v = np.log10(np.maximum(v, 10.0 ** self.lo))
        span = self.hi - self.lo
        return np.clip((v - self.lo) / (span if span > 0 else 1.0), 0, 1)

    def above(self, values: np.ndarray) -> np.ndarray:
        """Cells whose colour is clipped at the top: (gh, gw) bool."""
        v = np.asarray(values, dtype=np.float64)
        top = 10.0 ** self.hi if self.log else self.hi
        return (np.abs(v) if self.signed else v) > top * (1 + 1e-9)

    def strength(self, values: np.ndarray) -> np.ndarray:
        """[0, 1]: how far along the scale each value is from its "nothing" end, for opacity: the position for a
        magnitude scale, the distance from the centre (0) for a signed one."""
        position = self.normalise(values)
        return np.abs(2 * position - 1) if self.signed else position

    def to_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "log10": self.log, "rule": self.rule, "flat": self.flat,
                "signed": self.signed}


def signed_scales(maps: np.ndarray, mode: str = "robust per head", *, exclude: np.ndarray | None = None,
                  percentile: float = ROBUST_PERCENTILE) -> list[ColourScale]:
    """One symmetric scale per signed map (relevance: positive raises the target, negative lowers it), centred on 0.

    Args:
        maps: (k, gh, gw) signed maps.
        mode: as :func:`colour_scale`: ``"shared across heads"`` one scale over all maps, ``"full range per map"``
            each map's largest |value| (nothing clipped), otherwise (``"robust per head"``, ``"log"``, which has
            no meaning for values of both signs) each map's ``percentile``-th percentile of |value|.
        exclude: (gh, gw) bool, cells that never set a limit.
    """
    maps = np.asarray(maps, dtype=np.float64)
    keep = np.ones(maps.shape[1:], dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    if not keep.any():
        keep[:] = True
    magnitude = np.abs(np.where(np.isfinite(maps[:, keep]), maps[:, keep], np.nan))  # (k, cells)
    top = 100.0 if mode == "full range per map" else percentile
    what = "largest |value|" if top == 100 else f"{top:g}th percentile of |value|"
    if mode == "shared across heads":
        limit = _top(np.nanpercentile(magnitude, top))
        return [ColourScale(-limit, limit, rule=f"centred on 0, ± the {what} of all maps, shared", signed=True)] * len(maps)
    return [ColourScale(-(limit := _top(np.nanpercentile(m, top))), limit, signed=True,
                        rule=f"centred on 0, ± each map's {what}") for m in magnitude]


def colour_scale(maps: np.ndarray, mode: str = "robust per head", *, exclude: np.ndarray | None = None,
                 percentile: float = ROBUST_PERCENTILE) -> list[ColourScale]:
    """One colour scale per map, chosen by ``mode`` (see :data:`SCALE_MODES`).

    Args:
        maps: (k, gh, gw) non-negative maps meant to be compared (e.g. every head of a layer).
        mode: ``"robust per head"``: 0 .. the map's ``percentile``-th percentile, so one hot patch
            does not flatten the rest; ``"shared across heads"``: 0 .. that percentile over all
            maps together, one scale for all; ``"log"``: log10 from the 1st to the 99.9th percentile
            of all maps, one scale; ``"full range per map"``: each map's min .. max (nothing clipped).
        exclude: (gh, gw) bool, cells that never set a limit (the query patch itself, attention sinks).
        percentile: the robust top.

    Returns:
        k scales (the same object repeated when the scale is shared).
    """
    maps = np.asarray(maps, dtype=np.float64)
    if mode not in SCALE_MODES:
        raise OptionError(f"colour scale must be one of {SCALE_MODES}, not {mode!r}")
    keep = np.ones(maps.shape[1:], dtype=bool) if exclude is None else ~np.asarray(exclude, dtype=bool)
    if not keep.any():
        keep[:] = True
    values = maps[:, keep]  # (k, cells used for limits)
    finite = np.where(np.isfinite(values), values, np.nan)
    if mode == "full range per map":
        return [_flat_scale(v) or ColourScale(float(np.nanmin(v)), _top(np.nanmax(v)),
                                              rule="each map's minimum to its maximum") for v in finite]
    if mode == "robust per head":
        return [_flat_scale(v) or ColourScale(0.0, _top(np.nanpercentile(v, percentile)),
                                              rule=f"0 to each map's {percentile:g}th percentile") for v in finite]
    if mode == "shared across heads":
        shared = ColourScale(0.0, _top(np.nanpercentile(finite, percentile)),
                             rule=f"0 to the {percentile:g}th percentile of all maps, shared")
        return [shared] * len(maps)
    positive = finite[finite > 0]
    lo, hi = (np.percentile(positive, [1, 99.9]) if positive.size else (1e-6, 1.0))
    lo, hi = np.log10(max(lo, 1e-12)), np.log10(max(hi, lo * 10 if lo > 0 else 1e-6))
    shared = ColourScale(float(lo), float(max(hi, lo + 1e-6)), log=True,
                         rule="log10, 1st to 99.9th percentile of all maps, shared")
    return [shared] * len(maps)


def _flat_scale(values: np.ndarray) -> ColourScale | None:
    """The mid-scale of a map with no pattern (every value within :data:`FLAT_RELATIVE` of its mean), or None."""
    mean = float(np.nanmean(values))
    if not np.isfinite(mean) or float(np.nanmax(values) - np.nanmin(values)) > FLAT_RELATIVE * abs(mean):
        return None
    return ColourScale(0.0, 2 * mean if mean > 0 else 1.0, rule=FLAT_RULE, flat=True)


def _top(value: float) -> float:
    return float(value) if np.isfinite(value) and value > 0 else 1.0


def colourise(values: np.ndarray, scale: ColourScale, cmap: str = "Inferno") -> np.ndarray:
    """(h, w) values -> (h, w, 3) uint8 through the exact lookup table of ``cmap``."""
    idx = np.round(np.nan_to_num(scale.normalise(values), nan=0.0) * 255).astype(np.intp)
    return lookup_table(cmap)[idx]
