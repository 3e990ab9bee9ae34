"""The readout with its norms' scales frozen: an affine function of the tokens.

The final norm (and ``fc_norm`` after pooling where a model has one) divides by a scale computed from its own
input — σ for a LayerNorm, the root mean square for an RMSNorm. Frozen at the value of the image's own forward
(TransformerLens's ``apply_ln_to_stack``), the readout tokens -> target is affine for every head that pools and
projects linearly, so the target splits exactly into what each part of the residual stream wrote:

    LN(Σ_c c) = Σ_c γ ⊙ (c − mean(c)) / σ + β        (σ frozen; RMSNorm: no centring, no β)

:class:`FrozenNorms` is a :class:`vitviz.adapters.Rules`: it runs the family's own readout (its norms, pooling and
head, :meth:`vitviz.adapters.Adapter.readout`), first recording each norm's scale, then replaying them for any other
tokens (all-zero tokens give the constant part; a batch of components gives each one's image).
"""
from __future__ import annotations

import torch

from ..adapters import Rules
from ..errors import VitvizError


class ReadoutNotApplicable(VitvizError):
    """The model's readout cannot be split into direct contributions (its sentence says why)."""


def _kind(module: torch.nn.Module) -> str:
    """``"layer"`` for a LayerNorm over the last axis, ``"rms"`` for an RMSNorm; else the readout refuses."""
    if isinstance(module, torch.nn.LayerNorm) and len(module.normalized_shape) == 1:
        return "layer"
    name = type(module).__name__.lower()
    if "rmsnorm" in name and hasattr(module, "weight"):
        return "rms"
    raise ReadoutNotApplicable(f"the readout's norm is a {type(module).__name__}, whose scale vitviz cannot freeze "
                               "yet (LayerNorm and RMSNorm can): the direct readout does not apply to this model.")


def _eps(module: torch.nn.Module, x: torch.Tensor) -> float:
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = getattr(module, "variance_epsilon", None)
    return torch.finfo(x.dtype).eps if eps is None else float(eps)


class FrozenNorms(Rules):
    """Norms whose scale is recorded on the first pass and replayed on every later one.

    Args:
        repeat: on replay, each recorded scale is repeated this many times along the batch (a batch of ``repeat``
            components per image, image-major), so a batch of components uses its own image's scales.
    """

    def __init__(self):
        self.scales: list[torch.Tensor] = []
        self._replay: int | None = None
        self._repeat = 1
        self._image: int | None = None

    def replay(self, repeat: int = 1, image: int | None = None) -> "FrozenNorms":
        """Switch to replaying the recorded scales (from the first norm again).

        Args:
            repeat: each image's scales repeated this many times along the batch (image-major).
            image: replay only this image's scales (the batch then holds ``repeat`` inputs of that image).
        """
        self._replay, self._repeat, self._image = 0, repeat, image
        return self

    def norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        kind = _kind(module)
        if self._replay is None:
            sq = x.pow(2) if kind == "rms" else (x - x.mean(-1, keepdim=True)).pow(2)
            scale = (sq.mean(-1, keepdim=True) + _eps(module, x)).sqrt().detach()
            self.scales.append(scale)
        else:
            scale = self.scales[self._replay]
            self._replay += 1
            if self._image is not None:
                scale = scale[self._image:self._image + 1]
            if self._repeat > 1:
                scale = scale.repeat_interleave(self._repeat, dim=0)
        y = (x if kind == "rms" else x - x.mean(-1, keepdim=True)) / scale.to(x.dtype)
        if getattr(module, "weight", None) is not None:
            y = y * module.weight.to(x.dtype)
        if kind == "layer" and module.bias is not None:
            y = y + module.bias.to(x.dtype)
        return y
