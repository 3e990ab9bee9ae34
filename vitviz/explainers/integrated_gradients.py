"""Integrated Gradients (Sundararajan et al., ICML 2017) with Captum's implementation.

Relevance = (x - x') ⊙ ∫₀¹ ∂s(x' + α(x - x'))/∂x dα, summed over colour channels; the baseline x' is the
normalised zero image (the dataset's mean colour: the faithfulness protocols' "mean" replacement), the integral
Captum's Gauss-Legendre rule with ``steps`` nodes. Completeness: the pixels' sum equals s(x) - s(x') up to the
quadrature error, which :attr:`Map.settings` reports (``convergence_delta``).
"""
import numpy as np
import torch

from .base import Map, MapMethod, bound_target, patch_sums, register_method, repeat_target, why_not_attribution


@register_method
class IntegratedGradients(MapMethod):
    """Options: ``steps`` (quadrature nodes, default 32), ``batch_size`` (interpolated inputs per forward,
    default 16)."""

    name, label, signed, pixels = "integrated_gradients", "Integrated Gradients", True, True
    needs = ("gradients",)
    summary = "gradients integrated from the mean-colour image to the input (Captum), times the difference; signed"

    def why_not(self, lens):
        return why_not_attribution(lens.model, "gradient")

    def compute(self, lens, x, target=None, trace=None, steps: int = 32, batch_size: int = 16):
        from captum.attr import IntegratedGradients as CaptumIG

        param = next(lens.model.parameters())
        x = x.detach().to(device=param.device, dtype=param.dtype)
        bound, values = bound_target(lens, x, target)
        layout = lens.layout_for(x)
        pixels, deltas = [], []
        for i in range(len(x)):
            def score(z, i=i):
                return repeat_target(bound, i, len(z))(lens.trace(z, keep=(bound.point,), grad=None))

            with torch.enable_grad():
                attr, delta = CaptumIG(score).attribute(x[i:i + 1], baselines=torch.zeros_like(x[i:i + 1]),
                                                        n_steps=steps, internal_batch_size=batch_size,
                                                        return_convergence_delta=True)
            pixels.append(attr.detach().sum(1).double())
            deltas.append(float(delta.detach().abs().max()))
        pixels = torch.cat(pixels)
        return Map(self.name, patch_sums(pixels, layout).cpu().numpy(), pixels.cpu().numpy(), values, bound, signed=True,
                   settings={"method": self.name, "steps": steps, "baseline": "the normalised zero image (mean colour)",
                    "target": bound.describe(), "convergence_delta": deltas})
