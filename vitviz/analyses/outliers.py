"""What distorts the maps, read: high-norm outlier tokens and the MLP neurons that write them.

Large ViTs write a few high-norm "outlier" tokens into background patches, and attention to them drowns
the maps (Darcet et al. 2024, "Vision Transformers Need Registers"). Jiang et al. 2025 ("Vision
Transformers Don't Need Trained Registers", code ``nickjiang2378/test-time-registers``) found that a few
MLP neurons write them. This module reads the norms (``blocks.i.resid_post``), applies the outlier rule and
ranks the neurons (``blocks.i.mlp_hidden``); their repair lives in :mod:`vitviz.analyses.registers`, which
re-exports every name here.

Layers are 0-based in arrays and in these functions; every file and screen a user reads says 1-based.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from ..adapters import compose_edits, point_name
from ..errors import OptionError, ViewNotApplicable
from ..layout import TokenLayout
from ..lens import Lens
from ..tensors import to_host
from .tokens import ARTIFACT_FACTOR

OUTLIER_FACTOR = ARTIFACT_FACTOR
EMERGENCE_SHARE = 0.5


def outlier_rule(factor: float = OUTLIER_FACTOR) -> str:
    """The outlier rule in words (settings, registers.json and the page say the same)."""
    return (f"a patch token is an outlier in a layer when its output norm (the block's output, before the final "
            f"norm) exceeds {factor:g} x the median patch-token norm of that image in that layer")


# ---------------------------------------------------------------------------------------------
# Reading: norms and outliers


@torch.inference_mode()
def token_norms(model, x: torch.Tensor, edit=None) -> torch.Tensor:
    """The L2 norm of every token leaving every block: (B, 3, H, W) -> (B, L, N) float32 on the model's device.

    ``edit``: the adapters' ``edit=`` run in the same forward (e.g. a repair; then N counts its tokens).
    """
    norms: dict[int, torch.Tensor] = {}

    def keep(value, point):
        norms[point.layer] = value.float().norm(dim=-1)
        return value

    lens = Lens.around(model)
    lens.trace(x, keep=[], edit=compose_edits(edit, {"blocks.*.resid_post": keep}),
               stop_after=point_name("resid_post", lens.num_layers - 1), grad=None)
    return torch.stack([norms[i] for i in range(len(norms))], dim=1)


@dataclass
class Outliers:
    """High-norm patch tokens of an image set, layer by layer.

    Attributes:
        norms: (B, L, N) token norms leaving each block (prefix tokens first).
        layout: the token layout of N.
        factor: the rule's multiple of the median patch norm (:func:`outlier_rule`).
        median: (B, L) median patch-token norm per image and layer.
        mask: (B, L, P) patch tokens above ``factor`` x ``median`` (raster order).
    """

    norms: np.ndarray
    layout: TokenLayout
    factor: float
    median: np.ndarray
    mask: np.ndarray

    @property
    def threshold(self) -> np.ndarray:
        """(B, L) the norm above which a patch is an outlier."""
        return self.factor * self.median

    @property
    def ratio(self) -> np.ndarray:
        """(B, L) the largest patch norm over the median patch norm."""
        return self.norms[:, :, self.layout.patch_slice].max(axis=-1) / self.median

    @property
    def images_per_layer(self) -> np.ndarray:
        """(L,) images with at least one outlier in each layer."""
        return self.mask.any(axis=-1).sum(axis=0)

    @property
    def any(self) -> bool:
        return bool(self.mask.any())

    @property
    def emergence_layer(self) -> int | None:
        """The first layer (0-based) whose count of images with outliers reaches ``EMERGENCE_SHARE`` of the
        largest count over layers (a stray token in one early layer does not count); None without outliers."""
        counts = self.images_per_layer
        if counts.max() == 0:
            return None
        return int(np.flatnonzero(counts >= EMERGENCE_SHARE * counts.max())[0])

    @property
    def largest_ratio_per_layer(self) -> np.ndarray:
        """(L,) the largest patch norm over the median, per layer, over the whole set."""
        return self.ratio.max(axis=0)

    @property
    def layers_with_outliers(self) -> list[int]:
        """The layers (0-based) where at least one image has an outlier."""
        return [int(i) for i in np.flatnonzero(self.images_per_layer)]

    def norm_map(self, image: int, layer: int) -> np.ndarray:
        """(1, gh, gw) image ``image``'s patch-token norms leaving ``layer`` (both 0-based), over the grid."""
        return self.layout.patch_grid(self.norms[image, layer])[None]

    def positions(self, layer: int) -> list[np.ndarray]:
        """Per image, the outlier patches of ``layer`` (raster indices, 0-based)."""
        return [np.flatnonzero(m) for m in self.mask[:, layer]]

    def percentiles(self, q=(50, 99, 100)) -> np.ndarray:
        """(len(q), L) percentiles of the patch norms per layer over every image's patches."""
        patch = self.norms[:, :, self.layout.patch_slice]
        return np.percentile(patch.transpose(1, 0, 2).reshape(patch.shape[1], -1), q, axis=1)


def find_outliers(norms: np.ndarray, layout: TokenLayout, factor: float = OUTLIER_FACTOR) -> Outliers:
    """Apply the outlier rule (:func:`outlier_rule`) to token norms: (B, L, N) -> :class:`Outliers`."""
    if factor <= 1:
        raise OptionError(f"The outlier factor must be above 1 (a multiple of the median norm), not {factor:g}.")
    norms = np.asarray(norms, dtype=np.float64)
    patch = norms[:, :, layout.patch_slice]
    median = np.median(patch, axis=-1)
    return Outliers(norms=norms, layout=layout, factor=float(factor), median=median,
                    mask=patch > factor * median[..., None])


# ---------------------------------------------------------------------------------------------
# The register-neuron search (Jiang et al. 2025, ``find_register_neurons``)


@dataclass(frozen=True)
class RegisterNeuron:
    """One MLP hidden unit (after the activation): ``layer`` 0-based, ``index`` into the hidden units,
    ``score`` its mean |activation| at the outlier positions."""

    layer: int
    index: int
    score: float

    def to_dict(self) -> dict:
        """As registers.json writes it: layer 1-based."""
        return {"layer": self.layer + 1, "index": self.index, "score": self.score}


SEARCH_RULE = ("each MLP hidden unit (after the activation) of the layers up to and including the emergence layer "
               "is scored by its mean |activation| at the image's outlier patches of the detection layer, averaged "
               "over the images that have outliers; best first (Jiang et al. 2025)")


@dataclass
class Search:
    """What :func:`search_register_neurons` found.

    Attributes:
        outliers: the norms and outliers of the set.
        detect_layer: the layer (0-based) whose outliers were the positions.
        scores: (L, D_mlp) mean |activation| at the outlier positions (NaN: no image had outliers).
        neurons: the ranked units of the layers up to the emergence layer, best first (empty without outliers).
        images_with_outliers: how many images the scores average over.
    """

    outliers: Outliers
    detect_layer: int
    scores: np.ndarray
    neurons: list[RegisterNeuron]
    images_with_outliers: int

    def to_json(self) -> dict:
        """registers.json: ``threshold`` (the factor), ``emergence_layer`` and ``detect_layer`` 1-based,
        ``neurons`` best first with 1-based layers, and the rules in words."""
        o = self.outliers
        emergence = o.emergence_layer
        return {
            "threshold": o.factor,
            "threshold_rule": outlier_rule(o.factor),
            "emergence_layer": None if emergence is None else emergence + 1,
            "emergence_rule": f"the first layer in which at least {EMERGENCE_SHARE:.0%} as many images have an "
                              "outlier as in the layer with the most",
            "detect_layer": self.detect_layer + 1,
            "images": int(o.norms.shape[0]),
            "images_with_outliers": self.images_with_outliers,
            "search_rule": SEARCH_RULE,
            "neurons": [n.to_dict() for n in self.neurons],
            "token_layout": o.layout.to_dict(),
        }


def _check_hidden_point(model, x: torch.Tensor) -> None:
    """A sentence when the family's MLP has no ``mlp_hidden`` point (its class is not spelled out)."""
    name = point_name("mlp_hidden", 0)
    if name not in Lens.around(model).trace(x[:1], keep=(name,), stop_after=point_name("resid_post", 0), grad=None):
        raise ViewNotApplicable(f"{type(model).__name__}'s MLP is run as its own module here: its hidden units "
                                "cannot be read, so there are no register neurons to search.")


def search_register_neurons(model, batches: Iterable[torch.Tensor], layout: TokenLayout,
                            factor: float = OUTLIER_FACTOR, detect_layer: int = -1, top: int | None = 50) -> Search:
    """Rank the MLP hidden units that write the outliers (Jiang et al. 2025), one forward per batch.

    Each forward reads every block's output norms and hidden units (``blocks.i.resid_post``,
    ``blocks.i.mlp_hidden``) and keeps, per image, each unit's mean |activation| at that image's outlier
    patches of ``detect_layer`` (B x L x D_mlp floats); the ranking is made once the set is in, over the
    layers up to the emergence layer (known only then).

    Args:
        model: a model an adapter reads.
        batches: (b, 3, H, W) normalised inputs on the model's device.
        layout: their token layout.
        factor: the outlier rule's multiple of the median patch norm.
        detect_layer: the layer (0-based; -1 the last, Jiang et al.'s default) whose outliers are the positions.
        top: keep the best ``top`` units (None: every unit of the searched layers).
    """
    lens = Lens.around(model)
    depth = lens.num_layers
    detect = detect_layer % depth
    all_norms, all_scores = [], []
    for x in batches:
        if not all_norms:
            _check_hidden_point(model, x)
        hidden: dict[int, torch.Tensor] = {}
        norms: dict[int, torch.Tensor] = {}

        def keep_hidden(value, point):
            hidden[point.layer] = value.detach()
            return value

        def keep_norm(value, point):
            norms[point.layer] = value.detach().float().norm(dim=-1)
            return value

        with torch.inference_mode():
            lens.trace(x, keep=[], edit={"blocks.*.mlp_hidden": keep_hidden, "blocks.*.resid_post": keep_norm},
                       stop_after=point_name("resid_post", depth - 1), grad=None)
            n = torch.stack([norms[i] for i in range(depth)], dim=1)  # (b, L, N)
            patch = n[:, detect, layout.patch_slice]
            mask = patch > factor * patch.quantile(0.5, dim=-1, keepdim=True)  # (b, P), numpy's median
            weights = mask.float() / mask.sum(dim=-1, keepdim=True).clamp_min(1)  # the mean over the outliers
            scores = torch.stack([torch.einsum("bp,bpk->bk", weights, hidden[i][:, layout.patch_slice].float().abs())
                                  for i in range(depth)], dim=1)  # (b, L, D_mlp)
        all_norms.append(to_host(n))
        all_scores.append(to_host(scores))
    outliers = find_outliers(np.concatenate(all_norms), layout, factor)
    has = outliers.mask[:, detect].any(axis=-1)
    emergence = outliers.emergence_layer
    per_image = np.concatenate(all_scores)
    if emergence is None or not has.any():
        return Search(outliers, detect, np.full(per_image.shape[1:], np.nan), [], 0)
    scores = per_image[has].mean(axis=0)
    searched = scores[:emergence + 1]
    D = searched.shape[1]
    order = np.argsort(-searched, axis=None, kind="stable")
    if top is not None:
        order = order[:top]
    neurons = [RegisterNeuron(int(i // D), int(i % D), float(searched.flat[i])) for i in order]
    return Search(outliers, detect, scores, neurons, int(has.sum()))
