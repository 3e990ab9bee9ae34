"""Which pixels and patches made the model give its output: AttnLRP, CP-LRP, LeGrad and Grad-CAM.

Every method runs on the adapters' spelled-out forward (:mod:`vitviz.adapters`), so one
implementation serves every family whose forward is spelled out.

- **AttnLRP** (Achtibat et al., ICML 2024) as a modified gradient, the way its reference code ``lxt``
  computes it: Gradient × Input through a forward whose norms hold their normalising statistics
  constant, whose element-wise activations pass the gradient f(x)/x (the identity rule) and whose
  bilinear products (q·kᵀ, attention @ v, gates) give each operand half the gradient (the uniform
  rule); softmax, linear layers, the patch embedding and residual adds keep the true Jacobian. The
  rules are :class:`AttnLRP`, a :class:`vitviz.adapters.Rules`; the forward's *values* are unchanged.
- **CP-LRP** (Ali et al., ICML 2022): the same, with the attention probabilities held constant.
- **Gradient × Input**: the plain gradient (the rules switched off), a baseline.
- **LeGrad** (Bousselham et al., CVPR 2025): per layer, the target computed from that layer's tokens through
  the final norm and head; its gradient with respect to that layer's attention map, ReLU, mean over
  heads and query rows, prefix columns dropped; summed over layers and min-max scaled. Window attention
  (Swin): the gradient of the target itself with respect to each layer's window attention (the head reads
  only the last stage), ReLU, mean over heads and over the queries that share the key's window, each key
  put back at its place on its stage's grid, padding dropped; each stage's map given to the patches its
  tokens merge (nearest), summed over layers and min-max scaled.
- **Grad-CAM for ViTs** (pytorch-grad-cam's recipe): a block's ``ln1`` activations weighted by the mean
  of their gradients over the patch tokens, ReLU; prefix tokens dropped. Window attention (Swin): its Swin
  recipe, on the block's stage grid, brought to the patch grid bilinearly (as pytorch-grad-cam resizes
  its map to the image); the stage-grid map is returned too.

Relevance at the pixels is Σ over colour channels of input ⊙ (modified) gradient, with the input
being the normalised model input; the patch map is its sum over each patch. What the pixels
receive is compared with the target's value (conservation): the rest went to the prefix tokens,
the position embedding, biases and the softmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..adapters import Hooks, Rules, adapter_for, point_name
from ..trace import trace_model
from ..errors import MethodError, OptionError, ViewNotApplicable
from ..layout import TokenLayout

# ---------------------------------------------------------------------------------------------
# Rules


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


# ---------------------------------------------------------------------------------------------
# Targets


class Target:
    """What is explained: a scalar per image computed from the forward's kept points.

    :meth:`bind` fixes what depends on the unperturbed input (the top-1 class, the reference vector)
    from the points of the forward at that input; the bound target is then a function of any points.
    """

    point = "logits"

    def bind(self, points: dict[str, torch.Tensor]) -> "Target":
        return self

    def __call__(self, points: dict[str, torch.Tensor]) -> torch.Tensor:  # -> (B,)
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class ClassLogit(Target):
    """The classifier's logit of class ``cls``; None = each image's top-1 of the unperturbed input.

    Attributes:
        classes: after :meth:`bind`, the class per image (B,).
    """

    cls: int | None = None
    classes: tuple[int, ...] | None = field(default=None, compare=False)
    labels: tuple[str, ...] | None = field(default=None, compare=False)

    def bind(self, points):
        logits = points["logits"].detach()
        if self.cls is None:
            classes = tuple(int(c) for c in logits.argmax(-1))
        else:
            if not 0 <= self.cls < logits.shape[-1]:
                raise OptionError(f"class {self.cls} is out of range: the model has {logits.shape[-1]} classes "
                                  f"(0 to {logits.shape[-1] - 1}).")
            classes = (self.cls,) * logits.shape[0]
        return ClassLogit(self.cls, classes, self.labels)

    def __call__(self, points):
        logits = points["logits"]
        index = torch.tensor(self.classes, device=logits.device)[:, None]
        return logits.gather(-1, index)[:, 0]

    def describe(self) -> dict:
        out = {"kind": "logit", "class": self.cls}
        if self.cls is None:
            out["rule"] = "top-1 class of each unperturbed image"
        if self.classes is not None:
            out["classes"] = list(self.classes)
        return out

    def text(self) -> str:
        if self.classes is not None and len(set(self.classes)) == 1:
            c = self.classes[0]
            name = f" ({self.labels[c]})" if self.labels and c < len(self.labels) else ""
            return f"logit of class {c}{name}" + (" (top-1)" if self.cls is None else "")
        return "logit of the top-1 class" if self.cls is None else f"logit of class {self.cls}"


@dataclass(frozen=True)
class Projection(Target):
    """Headless models: s(x) = ⟨p(x), p(x₀)⟩ / ‖p(x₀)‖, the pooled vector's projection on its own
    unperturbed direction (a cosine score has zero gradient at x₀).

    Args:
        reference: p(x₀) (B, D); None = the pooled vector of the input being explained (set by :meth:`bind`).
        vector: what the pooled vector is, in words.
    """

    reference: torch.Tensor | None = field(default=None, compare=False)
    vector: str = "the pooled vector"
    point = "pooled"

    def bind(self, points):
        if self.reference is not None:
            return self
        return Projection(points["pooled"].detach(), self.vector)

    def __call__(self, points):
        ref = self.reference.to(points["pooled"].dtype)
        return (points["pooled"] * ref).sum(-1) / ref.norm(dim=-1)

    def describe(self) -> dict:
        return {"kind": "projection", "vector": self.vector,
                "definition": "s(x) = <p(x), p(x0)> / ||p(x0)||, p = the pooled vector, x0 = the unperturbed image"}

    def text(self) -> str:
        return f"projection of {self.vector} on its unperturbed direction"


def for_lens(target: Target | None, lens, linear: bool = False) -> Target | None:
    """``target`` with what it reads from the opened model itself (a :class:`vitviz.TextTarget`'s text embeddings):
    its ``for_lens(lens, linear)`` where it has one. ``linear``: the caller (the direct readout) needs the target
    linear in the pooled vector."""
    resolve = getattr(target, "for_lens", None)
    return target if resolve is None else resolve(lens, linear=linear)


def default_target(model, cls: int | None = None) -> Target:
    """The logit of ``cls`` (default top-1) for a classifier, else the projection of the pooled vector."""
    adapter = adapter_for(model)
    if adapter.num_classes(model) > 0:
        return ClassLogit(cls, labels=adapter.class_labels(model))
    if cls is not None:
        raise ViewNotApplicable(f"class {cls} was asked for, but the model has no classifier head: its pooled vector's "
                                "projection is explained instead.")
    return Projection(vector=adapter.pooled_text(model))


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Attribution:
    """One method's maps for a batch.

    Attributes:
        method: ``"attnlrp"``, ``"cp-lrp"``, ``"gradient"``, ``"legrad"`` or ``"gradcam"``.
        patches: (B, gh, gw) the patch map (signed for the relevance methods).
        pixels: (B, H, W) relevance per pixel of the model input (relevance methods), or None.
        target_value: (B,) the target's value at the input.
        target: the bound target (its :meth:`Target.describe` goes into settings.json).
        coarse: (B, gh', gw') the map on the grid the method read when that is coarser than the patch grid (Grad-CAM
            on a Swin block of a later stage), before :func:`to_patch_grid` brought it to ``patches``; else None.
        coarse_layout: that grid's layout (its ``patch_size`` is the pixels per token), or None.
    """

    method: str
    patches: np.ndarray
    pixels: np.ndarray | None
    target_value: np.ndarray
    target: Target
    coarse: np.ndarray | None = None
    coarse_layout: TokenLayout | None = None

    @property
    def pixel_sum(self) -> np.ndarray | None:
        """(B,) the relevance the pixels receive, to compare with :attr:`target_value` (conservation)."""
        return None if self.pixels is None else self.pixels.reshape(len(self.pixels), -1).sum(-1)

    def conservation(self) -> list[dict] | None:
        """Per image: the target's value, the pixels' total relevance and their share of the value."""
        return None if self.pixels is None else conservation(self.target_value, self.pixel_sum)


def conservation(target_value: np.ndarray, pixel_sum: np.ndarray) -> list[dict]:
    """Per image: the target's value, the pixels' total relevance and their share of the value (None at 0)."""
    return [{"target_value": float(v), "pixel_relevance": float(p), "pixel_share": float(p / v) if v != 0 else None}
            for v, p in zip(target_value, pixel_sum)]


PIXEL_METHODS = ("attnlrp", "cp-lrp", "gradient")
METHODS = ("attnlrp", "cp-lrp", "legrad", "gradcam", "gradient")
LABELS = {"attnlrp": "AttnLRP", "cp-lrp": "CP-LRP", "legrad": "LeGrad", "gradcam": "Grad-CAM",
          "gradient": "Gradient × Input"}


def why_not(model, method: str | None = None) -> str | None:
    """One sentence saying why attribution (``method``: that method; None: the whole view) does not apply to
    ``model``, or None. Every method needs the family's forward spelled out in vitviz (the rules act there); LeGrad
    also reads each layer's tokens through the head (:meth:`Adapter.readout`)."""
    from ..adapters import Adapter

    adapter = adapter_for(model)
    why = adapter.why_not(model, "attribution")
    if why is None and method is not None:
        why = adapter.why_not_attribution(model, method)
    # A family attending globally without a readout that does not say which methods it refuses has not been
    # spelled out for them (window families' LeGrad differentiates the target itself: no readout needed)
    if why is None and adapter.scope == "global" and type(adapter).readout is Adapter.readout \
            and adapter.why_not_attribution(model, "legrad") is None:
        why = (f"Attribution (AttnLRP, LeGrad, Grad-CAM) is not supported yet for {adapter.label(model)} models: vitviz "
               "runs them through their library's own forward, where the relevance rules and per-layer gradients "
               "cannot act.")
    return why


def methods_for(model) -> tuple[list[str], dict[str, str]]:
    """(the methods of :data:`METHODS` that apply to ``model``, method -> the sentence refusing each other one)."""
    refused = {m: why for m in METHODS if (why := why_not(model, m))}
    return [m for m in METHODS if m not in refused], refused


def _check(model, method: str) -> None:
    why = why_not(model, method)
    if why:
        raise MethodError(why)


def _to_model(model, x: torch.Tensor) -> torch.Tensor:
    param = next(model.parameters())
    return x.detach().to(device=param.device, dtype=param.dtype)


def patch_sums(pixels: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(B, H, W) -> (B, gh, gw): the sum over each patch (pixels past the last whole patch are not read by the model)."""
    (gh, gw), (ph, pw) = layout.grid_size, layout.patch_size
    B = pixels.shape[0]
    return pixels[:, :gh * ph, :gw * pw].reshape(B, gh, ph, gw, pw).sum(dim=(2, 4))


def to_patch_grid(maps: torch.Tensor, coarse: TokenLayout, layout: TokenLayout, mode: str = "nearest") -> torch.Tensor:
    """(B, gh', gw') on a coarser grid (a Swin stage's: ``coarse.patch_size`` pixels per token, a whole multiple f of
    ``layout``'s) -> (B, gh, gw) on the patch grid: upsampled by f per axis, then cropped to the patch grid (patch
    merging pads odd grids, so the last coarse token may cover one patch row or column that does not exist).

    Args:
        mode: ``"nearest"`` (each coarse token's value given to the f x f patches it merges) or ``"bilinear"``
            (half-pixel centres, edges replicated: cv2's and pytorch-grad-cam's resize, no antialiasing).
    """
    (fy, fx) = (c // p for c, p in zip(coarse.patch_size, layout.patch_size))
    if (fy * layout.patch_size[0], fx * layout.patch_size[1]) != tuple(coarse.patch_size):
        raise ValueError(f"a grid of {coarse.patch_size} pixels per token is not a whole multiple of the "
                         f"{layout.patch_size} patches")
    gh, gw = layout.grid_size
    if (fy, fx) == (1, 1):
        return maps[:, :gh, :gw]
    if mode == "nearest":
        up = maps.repeat_interleave(fy, dim=1).repeat_interleave(fx, dim=2)
    elif mode == "bilinear":
        up = torch.nn.functional.interpolate(maps[:, None], size=(maps.shape[1] * fy, maps.shape[2] * fx),
                                             mode="bilinear", align_corners=False)[:, 0]
    else:
        raise OptionError(f"unknown upsampling {mode!r}: nearest or bilinear")
    return up[:, :gh, :gw]


def relevance(model, x: torch.Tensor, method: str = "attnlrp", target: Target | None = None) -> Attribution:
    """Gradient × Input of ``target`` at the pixels with ``method``'s rules: (B, 3, H, W) -> maps.

    Args:
        method: ``"attnlrp"``, ``"cp-lrp"`` or ``"gradient"`` (the plain gradient).
        target: default :func:`default_target`.

    Raises:
        MethodError: the model's family does not run its forward through the rules (sentence says why).
    """
    _check(model, method)
    rules = {"attnlrp": AttnLRP, "cp-lrp": CPLRP, "gradient": Rules}[method]()
    target = target or default_target(model)
    adapter = adapter_for(model)
    x = _to_model(model, x).requires_grad_(True)
    with torch.enable_grad():
        points = trace_model(model, x, keep=(target.point,), rules=rules, grad=None)
        bound = target.bind(points)
        score = bound(points)
        (grad,) = torch.autograd.grad(score.sum(), x)
    if method != "gradient" and rules.calls == 0:
        raise MethodError(f"{adapter.label(model)} models run through their library's own forward here, so "
                          f"{LABELS[method]}'s rules cannot be applied to them yet.")
    pixels = (x.detach() * grad).sum(1)
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    return Attribution(method, patch_sums(pixels, layout).double().cpu().numpy(), pixels.double().cpu().numpy(),
                       score.detach().double().cpu().numpy(), bound)


def _min_max(maps: torch.Tensor) -> torch.Tensor:
    flat = maps.reshape(len(maps), -1)
    lo, hi = flat.min(-1).values, flat.max(-1).values
    return ((flat - lo[:, None]) / (hi - lo).clamp_min(torch.finfo(flat.dtype).tiny)[:, None]).reshape(maps.shape)


def legrad(model, x: torch.Tensor, target: Target | None = None, layers: range | None = None) -> Attribution:
    """LeGrad (reference: ``WalBouss/LeGrad`` ``compute_legrad``): (B, 3, H, W) -> (B, gh, gw) in [0, 1].

    Window attention (Swin) has its own per-layer map (:func:`_legrad_windows`).

    Args:
        layers: 0-based blocks whose attention is read (across stages for Swin); default the last two (the
            reference's ``layer_index=-2``).
    """
    _check(model, "legrad")
    adapter = adapter_for(model)
    depth = adapter.num_layers(model)
    layers = range(max(depth - 2, 0), depth) if layers is None else layers
    target = target or default_target(model)
    x = _to_model(model, x).requires_grad_(True)  # so the attention maps are in a graph even with frozen weights
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    if adapter.scope == "window":
        return _legrad_windows(model, x, target, layers, layout)
    keep = [point_name(k, i) for i in layers for k in ("attn", "resid_post")] + [target.point]
    with torch.enable_grad():
        points = trace_model(model, x, keep=keep, grad=None)
        bound = target.bind(points)
        total = 0
        for i in layers:
            hooks = Hooks(keep=(target.point,))
            try:
                adapter.readout(model, points[point_name("resid_post", i)], hooks)
            except NotImplementedError:
                raise MethodError(f"LeGrad reads each layer's tokens through the model's head, which vitviz cannot "
                                  f"do yet for {adapter.label(model)} models.") from None
            attn = points[point_name("attn", i)]
            (grad,) = torch.autograd.grad(bound(hooks.kept).sum(), attn, retain_graph=True)
            total = total + grad.clamp_min(0).mean(dim=1).mean(dim=1)[:, layout.num_prefix_tokens:]
    gh, gw = layout.grid_size
    maps = _min_max(total.detach().double().reshape(-1, gh, gw))
    return Attribution("legrad", maps.cpu().numpy(), None, bound(points).detach().double().cpu().numpy(), bound)


def window_key_map(grad: torch.Tensor, geometry) -> torch.Tensor:
    """LeGrad's per-layer map on window attention: (B, nW, H, T, T) gradients w.r.t. one block's window attention ->
    (B, gh', gw') on the block's stage grid.

    ReLU, mean over heads, then for each key the mean over the queries that attend in the same window as it (real
    slots the shift mask lets reach it: a window that wrapped around the image edge is up to four windows); each
    key slot is put back at its token's place on the stage grid (the roll and partition undone by
    :meth:`~vitviz.adapters.windows.WindowGeometry.token_positions`); padding slots are dropped.
    """
    pos = torch.as_tensor(geometry.token_positions(), device=grad.device)  # (nW, T, 2), -1 for padding
    real = pos[..., 0] >= 0
    pairs = torch.as_tensor(geometry.keys_allowed(), device=grad.device) & real[:, :, None]  # (nW, query, key)
    per_pair = grad.clamp_min(0).mean(dim=2) * pairs  # (B, nW, T, T)
    per_key = per_pair.sum(dim=2)[:, real] / pairs.sum(dim=1)[real].to(grad.dtype)  # (B, real slots)
    gh, gw = geometry.grid_size
    out = torch.zeros(grad.shape[0], gh * gw, dtype=grad.dtype, device=grad.device)
    out[:, pos[real][:, 0] * gw + pos[real][:, 1]] = per_key  # every token is one real slot of one window
    return out.reshape(-1, gh, gw)


def _legrad_windows(model, x: torch.Tensor, target: Target, layers, layout: TokenLayout) -> Attribution:
    """LeGrad on window attention: the head reads only the last stage's tokens, so every layer's map is the gradient
    of the target itself (one backward for all layers) through :func:`window_key_map`, each stage's map given to the
    patches its tokens merge (:func:`to_patch_grid`, nearest), summed over ``layers`` and min-max scaled."""
    adapter = adapter_for(model)
    geometry = adapter.geometry(model, tuple(x.shape[-2:]))
    names = [point_name("attn", i) for i in layers]
    with torch.enable_grad():
        points = trace_model(model, x, keep=names + [target.point], grad=None)
        bound = target.bind(points)
        score = bound(points)
        grads = torch.autograd.grad(score.sum(), [points[n] for n in names])
    total = 0
    for i, grad in zip(layers, grads):
        g = geometry[i]
        total = total + to_patch_grid(window_key_map(grad.detach().double(), g), g.layout, layout, "nearest")
    maps = _min_max(total)
    return Attribution("legrad", maps.cpu().numpy(), None, score.detach().double().cpu().numpy(), bound)


def gradcam(model, x: torch.Tensor, target: Target | None = None, layer: int = -1) -> Attribution:
    """Grad-CAM with pytorch-grad-cam's ViT recipe: (B, 3, H, W) -> (B, gh, gw), ReLU'd, not rescaled.

    The activations A (B, N, D) of block ``layer``'s ``ln1`` (0-based; -1 the last), prefix tokens
    dropped; weights = the mean of ∂target/∂A over patches per channel; map = ReLU(Σ_c w_c A_c).
    Window attention (Swin; its recipe, ``layers[-1].blocks[-1].norm1``): A is on the block's stage grid
    (B, gh', gw', D); the map there is :attr:`Attribution.coarse`, and ``patches`` is it brought to the patch
    grid bilinearly (:func:`to_patch_grid`; pytorch-grad-cam resizes it to the image the same way).
    """
    _check(model, "gradcam")
    adapter = adapter_for(model)
    layer = layer % adapter.num_layers(model)
    target = target or default_target(model)
    x = _to_model(model, x).requires_grad_(True)
    layout = adapter.layout(model, tuple(x.shape[-2:]))
    name = point_name("ln1", layer)
    with torch.enable_grad():
        points = trace_model(model, x, keep=(name, target.point), grad=None)
        if name not in points:
            raise MethodError(f"Grad-CAM reads a block's ln1 activations, which {adapter.label(model)} models do not "
                              "show yet.")
        bound = target.bind(points)
        score = bound(points)
        (grad,) = torch.autograd.grad(score.sum(), points[name])
    acts = points[name].detach()
    if adapter.scope == "window":  # tokens on the block's stage grid (B, gh', gw', D), no prefix tokens
        grid = adapter.geometry(model, tuple(x.shape[-2:]))[layer].layout
        acts, grad = acts.flatten(1, 2), grad.flatten(1, 2)
    else:
        grid, npt = layout, layout.num_prefix_tokens
        acts, grad = acts[:, npt:], grad[:, npt:]
    cam = (grad.mean(dim=1, keepdim=True) * acts).sum(-1).clamp_min(0).double().reshape(-1, *grid.grid_size)
    value = score.detach().double().cpu().numpy()
    if grid.grid_size == layout.grid_size:
        return Attribution("gradcam", cam.cpu().numpy(), None, value, bound)
    patches = to_patch_grid(cam, grid, layout, "bilinear")
    return Attribution("gradcam", patches.cpu().numpy(), None, value, bound, cam.cpu().numpy(), grid)


def attribute(model, x: torch.Tensor, method: str, target: Target | None = None) -> Attribution:
    """One of :data:`METHODS` on a batch (B, 3, H, W)."""
    if method in PIXEL_METHODS:
        return relevance(model, x, method, target)
    if method == "legrad":
        return legrad(model, x, target)
    if method == "gradcam":
        return gradcam(model, x, target)
    raise MethodError(f"unknown attribution method {method!r}: choose from {', '.join(METHODS)}.")
