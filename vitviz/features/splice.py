"""An SAE spliced into the forward at its point, and what it explains: which latents drive a target (feature
attribution) and which pixels made a latent fire (:class:`LatentTarget`, for every map method of the registry).

The splice replaces the tokens x at the point by x̂ = decode(encode(x)) plus the reconstruction error held
constant: its value is ``x.detach() + (x̂ − x̂.detach())`` — exactly x (x̂ − x̂ is 0 element by element, so the
forward's output is bit for bit the plain one), while gradients reach x only through the latents z, as in
x̂ + stop_gradient(x − x̂) (Marks et al. 2024's error term). With ``error=False`` the point gets x̂ itself and the
output moves by what the SAE's reconstruction error carries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..explainers.targets import Target
from ..errors import VitvizError
from .sae import SAE


def _prefix_of(sae: SAE, num_prefix_tokens: int | None) -> int:
    if num_prefix_tokens is not None:
        return int(num_prefix_tokens)
    try:
        return int(sae.info["model"]["token_layout"]["num_prefix_tokens"])
    except (KeyError, TypeError):
        raise VitvizError("this SAE does not record its model's token layout: pass num_prefix_tokens (the CLS and "
                          "register tokens before the patches).") from None


def _point_of(sae: SAE, point: str | None) -> str:
    name = point or sae.info.get("point")
    if not name:
        raise VitvizError("this SAE does not say which point it reads: pass point='blocks.<layer>.<kind>'.")
    return name


class Splice:
    """``edit=`` for :meth:`vitviz.Lens.trace`: the SAE applied to the patch tokens at its point.

    Args:
        sae: the SAE. point: the adapters' name (``"blocks.5.resid_post"``); default the one sae.json names.
        error: keep the reconstruction error as a constant bypass (the output unchanged); False: x̂ replaces x.
        ablate: latents (0-based) set to 0 (concept deletion): a list for every image, or a (B, K) bool mask, one row
            per image; with the error term the point gets x − Σ_j z_j W_dec[j] / s over the ablated j (their share
            of the reconstruction removed, the rest of x kept).
        num_prefix_tokens: tokens before the patches (left as they are); default from sae.json's token layout.

    Attributes:
        latents: after a forward, z (B, n, K) of the patch tokens, in the autograd graph when the trace kept one.
    """

    def __init__(self, sae: SAE, point: str | None = None, error: bool = True, ablate=(),
                 num_prefix_tokens: int | None = None):
        self.sae, self.point, self.error = sae, _point_of(sae, point), error
        if isinstance(ablate, torch.Tensor) and ablate.dtype == torch.bool:
            self.ablate = ablate
        else:
            self.ablate = torch.zeros(sae.latents, dtype=torch.bool)
            self.ablate[torch.as_tensor(list(ablate), dtype=torch.long)] = True
        self.prefix = _prefix_of(sae, num_prefix_tokens)
        self.latents: torch.Tensor | None = None

    @property
    def edit(self) -> dict:
        """``{point: self}``, to pass as ``edit=``."""
        return {self.point: self}

    def __call__(self, value: torch.Tensor, point=None) -> torch.Tensor:
        sae = self.sae.to(device=value.device)
        x = value[:, self.prefix:]
        z = sae.encode(x.to(sae.W_dec.dtype))
        x_hat = sae.decode(z).to(value.dtype)
        ablating = bool(self.ablate.any())
        if ablating:
            mask = self.ablate.to(z.device)
            kept = z.masked_fill(mask[:, None, :] if mask.dim() == 2 else mask, 0.0)
            removed = x_hat - sae.decode(kept).to(value.dtype)  # the ablated latents' share, sum_j z_j W_dec[j] / s
            z = kept
        self.latents = z
        if not self.error:
            patches = x_hat - removed if ablating else x_hat
        else:
            patches = x.detach() + (x_hat - x_hat.detach())  # exactly x
            if ablating:
                patches = patches - removed
        return torch.cat([value[:, :self.prefix], patches], dim=1)


@dataclass
class FeatureAttribution:
    """Which latents drive the target.

    Attributes:
        scores: (B, K) Σ over patches of z ⊙ ∂target/∂z (activation × gradient), float64.
        per_patch: (B, n, K) the same before the sum over the n patch tokens.
        activations: (B, n, K) z at the unperturbed input.
        target_value: (B,) the target's value (the spliced forward's, equal to the plain one's).
        target: the bound target.
    """

    scores: np.ndarray
    per_patch: np.ndarray
    activations: np.ndarray
    target_value: np.ndarray
    target: Target


def feature_attribution(lens, x, sae: SAE, target: Target | None = None, rules=None,
                        num_prefix_tokens: int | None = None) -> FeatureAttribution:
    """Latent scores = activation × gradient of ``target`` through the splice (error term kept: the output is the
    plain forward's).

    Args:
        x: a ModelInput, a normalised tensor (B, 3, H, W) or images (as ``lens.trace`` takes them).
        target: default the top-1 logit, or the pooled vector's projection for headless models.
        rules: :class:`vitviz.explainers.rules.AttnLRP` (or CP-LRP) to take AttnLRP's modified gradient through the
            model's norms, softmax and products (the SAE's encoder and decoder are linear and its ReLU passes
            f(x)/x = its gradient, so the rules change nothing inside the splice); default the plain gradient.
    """
    from ..explainers.targets import default_target

    target = target or default_target(lens.model)
    splice = Splice(sae, error=True, num_prefix_tokens=num_prefix_tokens)
    trace = lens.trace(x, keep=[target.point], edit=splice.edit, grad=True, rules=rules)
    points = dict(trace)
    bound = target.bind(points)
    score = bound(points)
    (grad,) = torch.autograd.grad(score.sum(), splice.latents)
    z = splice.latents.detach()
    per_patch = (z * grad).double()
    return FeatureAttribution(per_patch.sum(1).cpu().numpy(), per_patch.cpu().numpy(), z.cpu().numpy(),
                              score.detach().double().cpu().numpy(), bound)


@dataclass(frozen=True)
class LatentTarget(Target):
    """A latent's activation as the score any map method explains: which pixels made latent ``latent`` fire.

    ``vitviz.explain(lens, x, "attnlrp", target=LatentTarget(sae, 12))``. The value is z_latent of the SAE's
    encoding of the tokens at its point: at patch ``patch`` (0-based raster index), or summed over the patches
    (None). Relevance methods, Integrated Gradients and occlusion explain it; LeGrad (which scores the output through
    the head) refuses it, and Grad-CAM (which differentiates at the last block's ln1) refuses a latent read before
    that point, each with a sentence (their ``why_not_target``); attention methods explain no target.

    Args:
        num_prefix_tokens: tokens before the patches; default from sae.json's token layout.
    """

    sae: SAE
    latent: int
    patch: int | None = None
    num_prefix_tokens: int | None = None
    binds_per_image = False  # nothing is fixed from the unperturbed image: the same target scores every copy

    def __post_init__(self):
        if not 0 <= self.latent < self.sae.latents:
            raise VitvizError(f"latent {self.latent} is out of range: the SAE has {self.sae.latents} (0 to "
                              f"{self.sae.latents - 1}).")

    @property
    def point(self) -> str:
        return _point_of(self.sae, None)

    def __call__(self, points):
        if self.point not in points:
            raise VitvizError(f"this map method scores the model's output, not tokens inside it: a latent target "
                              f"reads {self.point} (use AttnLRP, Gradient x Input, Integrated Gradients or "
                              "occlusion).")
        value = points[self.point]
        prefix = _prefix_of(self.sae, self.num_prefix_tokens)
        sae = self.sae.to(device=value.device)
        tokens = value[:, prefix:] if self.patch is None else value[:, prefix + self.patch:prefix + self.patch + 1]
        return sae.encode(tokens.to(sae.W_dec.dtype))[..., self.latent].sum(1).to(value.dtype)

    def describe(self) -> dict:
        return {"kind": "sae latent", "latent": self.latent, "patch": self.patch, "point": self.point,
                "definition": "z_latent of the SAE's encoding of the tokens at the point, "
                              + ("summed over the patches" if self.patch is None else "at the patch (0-based)")}

    def text(self) -> str:
        where = "summed over the patches" if self.patch is None else f"at patch {self.patch}"
        return f"latent {self.latent} {where}"
