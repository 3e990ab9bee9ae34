"""The attribution names the tests read, taken from where each lives: the map registry (vitviz.explainers.base), one
module per method (relevance.py for AttnLRP, CP-LRP and Gradient × Input, legrad.py, gradcam.py), the rules
(rules.py) and the targets (targets.py). The lists are the registry's; a method is run by its registered entry."""
from vitviz.explainers import get_method, registered
from vitviz.explainers.base import AttributionMethod, Map, conservation, patch_sums, to_patch_grid
from vitviz.explainers.base import why_not_attribution as why_not
from vitviz.explainers.gradcam import gradcam
from vitviz.explainers.legrad import legrad, window_key_map
from vitviz.explainers.relevance import relevance
from vitviz.explainers.rules import CPLRP, AttnLRP
from vitviz.explainers.targets import ClassLogit, Projection, Target, default_target, for_lens

Attribution = Map  # one type for one method's maps of a batch

METHODS = tuple(name for name, method in registered().items() if isinstance(method, AttributionMethod))
PIXEL_METHODS = tuple(name for name in METHODS if registered()[name].pixels)
LABELS = {name: registered()[name].label for name in METHODS}

__all__ = ["Attribution", "AttnLRP", "CPLRP", "ClassLogit", "LABELS", "METHODS", "PIXEL_METHODS", "Projection", "Target",
           "attribute", "conservation", "default_target", "for_lens", "gradcam", "legrad", "methods_for", "patch_sums",
           "relevance", "to_patch_grid", "why_not", "window_key_map"]


def attribute(model, x, method: str, target: Target | None = None) -> Map:
    """The registered ``method``'s maps of a batch on ``model`` itself (no Lens)."""
    return get_method(method).maps(model, x, target or default_target(model))


def methods_for(model) -> tuple[list[str], dict[str, str]]:
    """(the attribution methods that apply to ``model``, method -> the sentence refusing each other one)."""
    refused = {m: why for m in METHODS if (why := why_not(model, m))}
    return [m for m in METHODS if m not in refused], refused
