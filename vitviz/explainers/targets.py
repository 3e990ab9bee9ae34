"""What a map explains: a scalar per image computed from the forward's kept points (:class:`Target`), the classifier's
logit (:class:`ClassLogit`) or, for a headless model, the pooled vector's projection on its own unperturbed direction
(:class:`Projection`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..adapters import adapter_for
from ..errors import OptionError, ViewNotApplicable

__all__ = ["ClassLogit", "Projection", "Target", "default_target", "for_lens"]


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
