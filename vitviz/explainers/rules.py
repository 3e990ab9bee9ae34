"""The relevance rules: how norms, activations and attention products pass the gradient back, as
:class:`vitviz.adapters.Rules` the adapters' spelled-out forward runs through (the forward's *values* are unchanged).

- **AttnLRP** (Achtibat et al., ICML 2024) as a modified gradient, the way its reference code ``lxt``
  computes it: Gradient × Input through a forward whose norms hold their normalising statistics
  constant, whose element-wise activations pass the gradient f(x)/x (the identity rule) and whose
  bilinear products (q·kᵀ, attention @ v, gates) give each operand half the gradient (the uniform
  rule); softmax, linear layers, the patch embedding and residual adds keep the true Jacobian.
- **CP-LRP** (Ali et al., ICML 2022): the same, with the attention probabilities held constant.

The plain gradient (Gradient × Input) is :class:`vitviz.adapters.Rules` itself: the model's own Jacobian.
"""
from __future__ import annotations

import torch

from ..adapters import Rules
from ..errors import MethodError

__all__ = ["AttnLRP", "CPLRP", "Rules"]


class _IdentityRule(torch.autograd.Function):
    """Value fn(x), gradient fn(x)/(x + 1e-10) (lxt's ``identity_rule_implicit``, same epsilon)."""

    @staticmethod
    def forward(ctx, fn, x):
        out = fn(x)
        ratio = x + 1e-10
        ctx.save_for_backward(torch.div(out, ratio, out=ratio))  # in place: one activation-sized buffer, not two
        return out

    @staticmethod
    def backward(ctx, grad):
        (ratio,) = ctx.saved_tensors
        return None, ratio * grad


class _HalfGradient(torch.autograd.Function):
    """The identity whose gradient is halved (the uniform rule on one operand of a product of two)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


class _LayerNormRule(torch.autograd.Function):
    """LayerNorm's value, from the library's one fused kernel, with the gradient of (x − mean) / std where std is
    held constant (lxt's rule): ∂/∂x = (g′ − mean(g′)) / std over the normalised dims, g′ = g ⊙ weight.

    One kernel forward and three element-wise passes backward, where writing the rule out as tensor operations
    (subtract the mean, divide by a detached std, scale, shift) takes eight forward and six backward. The
    weight and bias get no gradient: relevance is read at the input.
    """

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps):
        y, _, rstd = torch.native_layer_norm(x, shape, weight, bias, eps)
        ctx.save_for_backward(weight, rstd)
        ctx.dims = tuple(range(-len(shape), 0))
        return y

    @staticmethod
    def backward(ctx, grad):
        weight, rstd = ctx.saved_tensors
        g = grad if weight is None else grad * weight
        # (g - mean g) * rstd as g * rstd - (mean g) * rstd: one full pass instead of two
        gx = torch.addcmul(-(g.mean(dim=ctx.dims, keepdim=True) * rstd), g, rstd)
        return gx.to(grad.dtype), None, None, None, None


def _layer_norm(module: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return _LayerNormRule.apply(x, tuple(module.normalized_shape), module.weight, module.bias, module.eps)


def _rms_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps).detach()
    return y if module.weight is None else y * module.weight


def _is_rms_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.RMSNorm) or type(module).__name__ in ("RmsNorm", "RMSNorm") \
        and hasattr(module, "eps") and hasattr(module, "weight")


class AttnLRP(Rules):
    """AttnLRP's rules (lxt 2.1's efficient implementation) as a modified gradient; forward values unchanged.

    Attributes:
        calls: how many norms, activations, products and softmaxes the forward passed through these
            rules (a forward that is not spelled out passes none: :func:`relevance` then refuses).
    """

    name = "attnlrp"

    def __init__(self):
        self.calls = 0

    def norm(self, module, x):
        """LayerNorm: (x − mean) / stop_gradient(std) (the mean is still differentiated); RMSNorm: x ·
        stop_gradient(1/rms)."""
        self.calls += 1
        if isinstance(module, torch.nn.LayerNorm):
            return _layer_norm(module, x)
        if _is_rms_norm(module):
            return _rms_norm(module, x)
        raise MethodError(f"AttnLRP has no rule for the norm {type(module).__name__}; relevance propagation "
                          "needs LayerNorm or RMSNorm.")

    def act(self, fn, x):
        self.calls += 1
        return _IdentityRule.apply(fn, x)

    def bilinear(self, a, b):
        """Half the gradient to each operand where both carry one (a product with a constant is linear)."""
        self.calls += 1
        if a.requires_grad and b.requires_grad:
            return _HalfGradient.apply(a), _HalfGradient.apply(b)
        return a, b

    def softmax(self, scores):
        self.calls += 1
        return super().softmax(scores)


class CPLRP(AttnLRP):
    """CP-LRP: AttnLRP's rules with the attention probabilities held constant (lxt's torchvision ViT map:
    its query and key carry no gradient), so attention @ v passes the whole gradient to v."""

    name = "cp-lrp"

    def softmax(self, scores):
        return super().softmax(scores).detach()
