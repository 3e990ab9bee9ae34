"""Gradient-weighted rollout (Chefer et al. 2021, generic): :func:`vitviz.analyses.rollout.class_gradient_rollout`."""
import numpy as np

from .targets import ClassLogit
from ..errors import VitvizError
from ..analyses.rollout import class_gradient_rollout
from .base import Map, MapMethod, register_method


@register_method
class GradientRollout(MapMethod):
    name, label, kind = "gradient_rollout", "gradient rollout", "relevance"
    needs = ("head", "gradients", "attention")
    summary = "rollout of each layer's attention weighted by the class logit's gradient (Chefer et al. 2021)"

    def compute(self, lens, x, target=None, trace=None, **options):
        if target is not None and not isinstance(target, ClassLogit):
            raise VitvizError(f"{self.label} explains a class logit; {target.text()} is not one.")
        cls = None if target is None else target.cls
        layout = lens.layout_for(x)
        out = [class_gradient_rollout(lens.model, x[i:i + 1], layout, cls) for i in range(len(x))]
        classes = [c for _, c in out]
        return Map(self.name, np.stack([m for m, _ in out]),
                   settings={"method": self.name, "target": {"kind": "logit", "class": cls, "classes": classes}})
