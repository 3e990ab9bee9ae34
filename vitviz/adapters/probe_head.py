"""A backbone with a linear probe as its head (:mod:`vitviz.probes`): the model a probe file gives.

:class:`ProbedModel` holds the backbone (any model another adapter reads, attending globally), the probe's layer
(0-based), its pooling and one linear layer. :class:`ProbeHeadAdapter` runs the backbone's own adapter up to the
probe's layer and reads that layer's tokens out as the backbone reads its last layer's (the backbone adapter's
``readout``: its final norm, its pooling), then:

- ``final_norm``: the probe layer's tokens through the backbone's final norm (B, N, D);
- ``pooled``: the probe's input — the backbone's pooled vector (``cls``), the mean of the normed patch tokens
  (``mean``) or both concatenated (``cls+mean``) (B, F);
- ``logits``: ``pooled @ weight.T + bias`` (B, K), the probe's classes in its order.

The model *is* the backbone's first ``layer + 1`` blocks and the probe: ``num_layers`` is ``layer + 1``, so every
view (rollout, LeGrad, Grad-CAM's last block, gradient rollout) reads the blocks the logits depend on, and a timm
model built with ``depth=layer + 1, num_classes=K`` holding the same weights computes the same function. The head is
a plain linear layer in the forward, so relevance rules treat it as one (the true Jacobian).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..errors import OptionError
from .base import Adapter, Hooks, point_name
from .registry import adapter_for, register_adapter

POOLINGS = ("cls", "mean", "cls+mean")


class ProbedModel(torch.nn.Module):
    """A backbone and a linear probe on the pooled vector of one of its layers.

    Args:
        backbone: the loaded backbone (shared, never changed; eval mode, frozen).
        weight: (K, F) the probe's weights; F = D for ``cls`` and ``mean``, 2D for ``cls+mean``.
        bias: (K,).
        layer: the probe's layer, 0-based.
        pooling: ``"cls"``, ``"mean"`` or ``"cls+mean"``.
        classes: the K class names in the head's order.
        info: the probe's description (probe.json), for model cards.
    """

    def __init__(self, backbone: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor, layer: int, pooling: str,
                 classes: tuple[str, ...], info: dict | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise OptionError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.backbone = backbone
        self.head = torch.nn.Linear(weight.shape[1], weight.shape[0])
        param = next(backbone.parameters())
        with torch.no_grad():
            self.head.weight.copy_(weight)
            self.head.bias.copy_(bias)
        self.head.to(device=param.device, dtype=param.dtype).requires_grad_(False)
        self.layer, self.pooling, self.classes, self.info = int(layer), pooling, tuple(classes), dict(info or {})

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) of images (B, 3, H, W), through the adapters' spelled-out forward."""
        from . import run

        return run(self, x, keep=("logits",))["logits"]


class _Reached(Exception):
    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens


class _Backbone:
    """The backbone's forward seen through the probed model's hooks: its named points go to ``outer`` (kept and
    edited there), the forward ends after ``stop`` (the probe layer's ``resid_post``), the backbone's own
    ``pooled`` is held here (not the probed model's ``pooled``) and its own logits are never computed.

    It wraps the probed model's :class:`Hooks` rather than being one: what it does not answer itself (``rules``,
    ``edits``, ``destination``, and whatever Hooks learns next) is ``outer``'s, so the backbone's forward asks the
    probed model's run and nothing is forwarded by hand.
    """

    def __init__(self, outer: Hooks, stop: str | None, want_pooled: bool = False):
        self.outer, self.stop, self.want_pooled = outer, stop, want_pooled
        self.pooled: torch.Tensor | None = None
        self.final_norm: torch.Tensor | None = None

    def __getattr__(self, name: str):
        if name == "outer":  # not set yet (a copy being built): no endless lookup
            raise AttributeError(name)
        return getattr(self.outer, name)  # only reached for what this class does not define

    def wants(self, name: str) -> bool:
        if name == "pooled":
            return self.want_pooled
        if name == "logits":
            return False
        return name == self.stop or self.outer.wants(name)

    def plain_blocks(self, depth: int) -> bool:
        return False  # the forward must stop at the probe's layer

    def __call__(self, name: str, value: torch.Tensor) -> torch.Tensor:
        if name == "pooled":
            self.pooled = value
            return value
        if name == "logits":
            return value
        value = self.outer(name, value)
        if name == "final_norm":
            self.final_norm = value
        if name == self.stop:
            raise _Reached(value)
        return value


@register_adapter
class ProbeHeadAdapter(Adapter):
    """A :class:`ProbedModel`: its backbone's adapter up to the probe's layer, then the probe."""

    name = "probe-head"
    library = "vitviz"
    families = ""  # not a family of its own: the backbone's adapter names it

    @staticmethod
    def inner(model: ProbedModel) -> Adapter:
        return adapter_for(model.backbone)

    def claims(self, model) -> bool:
        return isinstance(model, ProbedModel)

    def why_unsupported(self, model) -> str | None:
        return self.inner(model).why_unsupported(model.backbone)

    def label(self, model) -> str:
        return self.inner(model).label(model.backbone)

    def num_layers(self, model) -> int:
        return model.layer + 1

    def num_heads(self, model, layer: int = 0) -> int:
        return self.inner(model).num_heads(model.backbone, layer)

    def layout(self, model, input_hw=None):
        return self.inner(model).layout(model.backbone, input_hw)

    def num_classes(self, model) -> int:
        return model.num_classes

    def class_labels(self, model) -> tuple[str, ...]:
        return model.classes

    def forward(self, model, x: torch.Tensor, hooks: Hooks) -> None:
        try:
            self.inner(model).forward(model.backbone, x, _Backbone(hooks, point_name("resid_post", model.layer)))
        except _Reached as reached:
            tokens = reached.tokens
        else:
            raise RuntimeError(f"the backbone's forward ended before block {model.layer}")
        if any(hooks.wants(p) for p in ("final_norm", "pooled", "logits")):
            self.readout(model, tokens, hooks)

    def readout(self, model, tokens: torch.Tensor, hooks: Hooks) -> None:
        """Tokens (B, N, D) through the backbone's final norm and pooling, then the probe: ``final_norm``, ``pooled``
        (the probe's input) and ``logits``."""
        inner = _Backbone(hooks, None, want_pooled=model.pooling != "mean")
        self.inner(model).readout(model.backbone, tokens, inner)
        normed = inner.final_norm
        npt = self.layout(model, None).num_prefix_tokens
        if model.pooling == "cls":
            pooled = inner.pooled
        else:
            mean = normed[:, npt:].mean(dim=1)
            pooled = mean if model.pooling == "mean" else torch.cat([inner.pooled, mean], dim=-1)
        pooled = hooks("pooled", pooled)
        if hooks.wants("logits"):
            hooks("logits", F.linear(pooled, model.head.weight, model.head.bias))

    # --- everything else is the backbone's -----------------------------------------------------------------
    def why_not(self, model, view: str) -> str | None:
        return self.inner(model).why_not(model.backbone, view)

    def head_write(self, model, layer: int):
        return self.inner(model).head_write(model.backbone, layer)

    def why_not_attribution(self, model, method: str) -> str | None:
        return self.inner(model).why_not_attribution(model.backbone, method)

    def why_no_extra_token(self, model) -> str | None:
        return self.inner(model).why_no_extra_token(model.backbone)

    def position_encoding(self, model) -> str:
        return self.inner(model).position_encoding(model.backbone)

    def position_table(self, model):
        return self.inner(model).position_table(model.backbone)

    def native_pos_embed(self, model, layout):
        return self.inner(model).native_pos_embed(model.backbone, layout)

    def patch_filters(self, model) -> torch.Tensor:
        return self.inner(model).patch_filters(model.backbone)

    def attention_steps(self, model, layer: int) -> list[str]:
        return self.inner(model).attention_steps(model.backbone, layer)

    def layer_qkv(self, model, x: torch.Tensor, layer: int):
        return self.inner(model).layer_qkv(model.backbone, x, layer)

    def pooled_text(self, model) -> str:
        what = {"cls": self.inner(model).pooled_text(model.backbone), "mean": "the mean of the normed patch tokens",
                "cls+mean": f"{self.inner(model).pooled_text(model.backbone)} and the mean of the normed patch tokens"}
        return f"the probe's input at layer {model.layer + 1}: {what[model.pooling]}"

    def card(self, model) -> dict:
        card = self.inner(model).card(model.backbone)
        backbone_layers = card.get("layers")
        return card | {"layers": model.layer + 1, "backbone_layers": backbone_layers,
                       "probe": {"layer": model.layer + 1, "pooling": model.pooling, "classes": list(model.classes),
                                 "file": model.info.get("file")}}

    def architecture(self, model):
        return dataclasses.replace(self.inner(model).architecture(model.backbone), depth=model.layer + 1)
