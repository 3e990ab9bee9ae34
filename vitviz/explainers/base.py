"""The map-method registry: every method that turns an image into a patch map, by name.

A method is a :class:`MapMethod` subclass in its own module, registered with ``@register_method`` (the shape of
timm's ``register_model`` and of :mod:`vitviz.adapters`'s registry). The CLI, the app's pages and the
faithfulness runs read :func:`methods` and :func:`get_method`; nothing else lists the methods or chooses one by
name. Adding a method is one module in this package plus its name in :data:`METHOD_MODULES`; the registry's
parameterised tests then run it (``tests/test_explainers.py``).
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .targets import Target
from ..adapters import adapter_for
from ..errors import MethodError, OptionError
from ..layout import TokenLayout

# The method modules, in the order methods are listed (relevance first, then attention, then the baselines).
METHOD_MODULES = ("attnlrp", "cp_lrp", "gradient", "integrated_gradients", "legrad", "gradcam", "occlusion",
                  "rollout", "attention_flow", "gradient_rollout", "last_layer_mean", "random_map")
_METHODS: dict[str, "MapMethod"] = {}

# What a method can need, in words a user reads (the sentence refusing it names the missing one).
NEEDS = {
    "head": "a classifier head",
    "gradients": "gradients through the model's forward",
    "attention": "the attention probabilities of every layer",
    "global attention": "attention between all tokens (not inside windows)",
    "readout": "each layer's tokens read through the final norm and head",
}


@dataclass
class Map:
    """One method's maps for a batch.

    Attributes:
        method: the registry name (``"attnlrp"``).
        patches: (B, gh, gw) float64, one value per patch (signed for :attr:`signed` methods).
        pixels: (B, H, W) float64 per pixel of the model input, for methods that have them, else None.
        target_value: (B,) the explained score at the unperturbed input, or None (attention methods explain no score).
        target: the bound target (its ``describe()`` is in :attr:`settings`), or None.
        signed: whether values can be negative (draw diverging around 0) or not (sequential).
        settings: what decides the numbers (method, options, target), for settings.json.
        coarse: (B, gh', gw') the map on the coarser grid the method read (Grad-CAM on a late Swin stage), before
            :func:`to_patch_grid` brought it to ``patches``; else None.
        coarse_layout: that grid's layout (its ``patch_size`` is the pixels per token), or None.
    """

    method: str
    patches: np.ndarray
    pixels: np.ndarray | None = None
    target_value: np.ndarray | None = None
    target: Target | None = None
    signed: bool = False
    settings: dict = field(default_factory=dict)
    coarse: np.ndarray | None = None
    coarse_layout: TokenLayout | None = None

    @property
    def pixel_sum(self) -> np.ndarray | None:
        """(B,) the relevance the pixels receive, to compare with :attr:`target_value` (conservation)."""
        return None if self.pixels is None else self.pixels.reshape(len(self.pixels), -1).sum(-1)

    def conservation(self) -> list[dict] | None:
        """Per image: the target's value, the pixels' total relevance and their share (None without pixels)."""
        if self.pixels is None or self.target_value is None:
            return None
        return conservation(self.target_value, self.pixel_sum)


def conservation(target_value: np.ndarray, pixel_sum: np.ndarray) -> list[dict]:
    """Per image: the target's value, the pixels' total relevance and their share of the value (None at 0)."""
    return [{"target_value": float(v), "pixel_relevance": float(p), "pixel_share": float(p / v) if v != 0 else None}
            for v, p in zip(target_value, pixel_sum)]


class MapMethod:
    """One map method. Subclasses set the class attributes and implement :meth:`compute`.

    Attributes:
        name: registry key, as typed on the command line (``"attnlrp"``).
        label: as a reader of the papers writes it (``"AttnLRP"``).
        signed: maps can be negative.
        needs: keys of :data:`NEEDS`.
        kind: ``"relevance"`` (gradient-based, explains a target), ``"perturbation"`` (model-agnostic, explains a
            target), ``"attention"`` (reads attention, no target) or ``"baseline"``.
        summary: one line for ``vitviz.methods()`` and the CLI's help.
        pixels: the method gives a per-pixel map as well.
    """

    name = ""
    label = ""
    signed = False
    needs: tuple[str, ...] = ()
    kind = "relevance"
    summary = ""
    pixels = False

    def why_not(self, lens) -> str | None:
        """One sentence saying why this method does not apply to ``lens``'s model, or None."""
        label = self.label[:1].upper() + self.label[1:]
        if "head" in self.needs and not lens.has_head:
            return f"{label} needs a classifier head; {lens.label} has none."
        if ("global attention" in self.needs or "attention" in self.needs) and lens.scope != "global":
            return (f"{label} reads attention between all tokens; {lens.label} attends inside windows "
                    "(its window maps are on the Attribution page).")
        return None

    def why_not_target(self, lens, target: Target | None) -> str | None:
        """One sentence naming this method and ``target`` and saying why the method cannot explain it on ``lens``'s
        model (e.g. a target read inside the model, before the point the method differentiates at), or None."""
        return None

    def compute(self, lens, x: torch.Tensor, target: Target | None = None, trace=None, **options) -> Map:
        """The maps of a batch ``x`` (B, 3, H, W), normalised, on any device.

        Args:
            target: what relevance and perturbation methods explain (default: top-1 logit, or the pooled vector's
                projection for headless models).
            trace: a :class:`vitviz.Trace` of ``x`` that kept ``attn`` (attention methods reuse it instead of
                running the model again).
            options: the method's own settings (documented on its class).
        """
        raise NotImplementedError

    def info(self) -> dict:
        """What ``vitviz.methods()`` shows."""
        return {"name": self.name, "label": self.label, "kind": self.kind, "signed": self.signed,
                "needs": [NEEDS[n] for n in self.needs], "pixels": self.pixels, "summary": self.summary}


def register_method(cls: type[MapMethod]) -> type[MapMethod]:
    """Class decorator: register one instance of ``cls`` under ``cls.name``."""
    if not cls.name or cls.name in _METHODS:
        raise ValueError(f"map method name {cls.name!r} is empty or registered twice")
    for need in cls.needs:
        if need not in NEEDS:
            raise ValueError(f"{cls.name}: unknown need {need!r} (one of {', '.join(NEEDS)})")
    _METHODS[cls.name] = cls()
    return cls


@functools.cache
def _load_all() -> None:
    """Import every method module once: each registers its method as it is imported."""
    for module in METHOD_MODULES:
        importlib.import_module(f"{__package__}.{module}")


def registered() -> dict[str, MapMethod]:
    """Every registered method by name, in :data:`METHOD_MODULES` order (whichever module was imported first), then
    methods registered from elsewhere in the order they registered."""
    _load_all()
    order = {module: i for i, module in enumerate(METHOD_MODULES)}
    return dict(sorted(_METHODS.items(),
                       key=lambda item: order.get(type(item[1]).__module__.rsplit(".", 1)[-1], len(order))))


def get_method(name: str) -> MapMethod:
    """The method registered as ``name`` (case-insensitive; ``cp_lrp`` = ``cp-lrp``).

    Raises:
        MethodError: no such method (the sentence lists them).
    """
    methods = registered()
    key = name.strip().lower()
    found = methods.get(key) or methods.get(key.replace("_", "-")) or methods.get(key.replace("-", "_"))
    if found is None:
        raise MethodError(f"unknown map method {name!r}: choose from {', '.join(methods)}.")
    return found


def methods(lens=None) -> list[dict]:
    """Every map method with what it needs; with ``lens``, each also says whether it applies (``why_not``)."""
    out = []
    for m in registered().values():
        row = m.info()
        if lens is not None:
            row["why_not"] = m.why_not(lens)
        out.append(row)
    return out


def names(lens=None, kinds: tuple[str, ...] | None = None) -> list[str]:
    """Method names (those that apply to ``lens``'s model when given; of ``kinds`` when given), in registry order."""
    return [n for n, m in registered().items()
            if (kinds is None or m.kind in kinds) and (lens is None or m.why_not(lens) is None)]


class AttributionMethod(MapMethod):
    """A method whose rules or per-layer gradients act in the adapters' spelled-out forward (AttnLRP, CP-LRP,
    Gradient × Input, LeGrad, Grad-CAM): subclasses implement :meth:`maps` on the model itself."""

    needs = ("gradients",)

    def why_not(self, lens) -> str | None:
        return why_not_attribution(lens.model, self.name)

    def maps(self, model, x: torch.Tensor, target: Target) -> Map:
        """The maps of a batch ``x`` (B, 3, H, W) for ``target`` (bound here), on ``model`` (any device)."""
        raise NotImplementedError

    def compute(self, lens, x, target=None, trace=None, **options):
        from dataclasses import replace

        from .targets import default_target

        if options:
            raise MethodError(f"{self.label} takes no options (got {', '.join(options)}).")
        why = self.why_not_target(lens, target)
        if why:
            raise MethodError(why)
        found = self.maps(lens.model, x, target or default_target(lens.model))
        return replace(found, settings={"method": self.name, "target": found.target.describe()})


def why_not_attribution(model, method: str | None = None) -> str | None:
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


def to_model(model, x: torch.Tensor) -> torch.Tensor:
    param = next(model.parameters())
    return x.detach().to(device=param.device, dtype=param.dtype)


def patch_sums(pixels: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(B, H, W) -> (B, gh, gw): the sum over each patch (pixels past the last whole patch are not read by the model)."""
    (gh, gw), (ph, pw) = layout.grid_size, layout.patch_size
    B = pixels.shape[0]
    return pixels[:, :gh * ph, :gw * pw].reshape(B, gh, ph, gw, pw).sum(dim=(2, 4))


def check_attribution(model, method: str) -> None:
    """Raise :class:`MethodError` with :func:`why_not_attribution`'s sentence where ``method`` does not apply."""
    why = why_not_attribution(model, method)
    if why:
        raise MethodError(why)


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


def target_text(target: Target) -> str:
    """A target in words, for the sentences refusing it."""
    try:
        return target.text()
    except (NotImplementedError, TypeError, AttributeError):
        return type(target).__name__


def block_of(point: str) -> int | None:
    """The 0-based block of a block point name (``"blocks.5.resid_post"`` -> 5), None for model-level points."""
    parts = point.split(".")
    return int(parts[1]) if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() else None


def attention_of(lens, x: torch.Tensor, trace=None) -> np.ndarray:
    """(B, L, H, N, N) float32 on the host: from ``trace`` when it kept ``attn``, else one forward."""
    if trace is None:
        trace = lens.trace(x, keep="attn")
    return trace.stack("attn").detach().float().cpu().numpy()


def bound_target(lens, x: torch.Tensor, target: Target | None):
    """``target`` (default: top-1 logit, or the pooled vector's projection) bound on the unperturbed batch ``x``,
    with its value (B,) float64 — from the adapters' fused forward (``fast``), as perturbed copies are scored."""
    from .targets import default_target

    target = target or default_target(lens.model)
    with torch.no_grad():  # not inference mode: gradient methods use the bound reference in their graph
        points = lens.trace(x, keep=(target.point,), fast=True, grad=None)
        bound = target.bind(points)
        return bound, bound(points).double().cpu().numpy()


def repeat_target(bound: Target, index: int, n: int) -> Target:
    """A bound target of image ``index`` applied to ``n`` copies of it (perturbations, interpolation steps)."""
    from dataclasses import replace

    from .targets import ClassLogit, Projection

    if hasattr(bound, "repeat"):  # a target that knows what it fixed per image (vitviz.TextTarget)
        return bound.repeat(index, n)
    if isinstance(bound, ClassLogit):
        return replace(bound, classes=(bound.classes[index],) * n)
    if isinstance(bound, Projection):
        return Projection(bound.reference[index:index + 1].expand(n, -1), bound.vector)
    if not getattr(bound, "binds_per_image", True):  # e.g. an SAE latent: nothing fixed per image
        return bound
    raise MethodError(f"{type(bound).__name__} targets cannot be repeated over copies of an image yet.")


def parse_methods(text: str, kinds: tuple[str, ...] = ("relevance", "perturbation"), option: str = "--attribution"
                  ) -> list[str]:
    """``"attnlrp,cp-lrp"`` -> ``["attnlrp", "cp-lrp"]``, checked against the registered methods of ``kinds``
    (default those that explain a target: relevance and perturbation methods).

    Raises:
        MethodError: an unknown name (the sentence names ``option`` and lists the choices).
    """
    allowed = names(kinds=kinds)
    methods = [m.strip().lower() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in allowed]
    if unknown or not methods:
        raise MethodError(f"{option}: unknown method {', '.join(unknown) or '(none)'}; choose from {', '.join(allowed)}.")
    return list(dict.fromkeys(methods))
