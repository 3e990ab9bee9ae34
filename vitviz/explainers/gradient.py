"""Gradient × Input: the plain gradient of the target times the normalised input, summed over colour channels."""
from .base import AttributionMethod, register_method
from .relevance import relevance
from .rules import Rules


@register_method
class GradientTimesInput(AttributionMethod):
    name, label, signed, pixels = "gradient", "Gradient × Input", True, True
    rules = Rules
    summary = "the plain gradient times the input (the baseline the LRP rules improve on); per pixel, signed"

    def maps(self, model, x, target):
        return relevance(model, x, self.name, target)
