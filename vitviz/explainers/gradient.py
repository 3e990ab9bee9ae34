"""Gradient × Input: the plain gradient of the target times the normalised input, summed over colour channels."""
from .base import AttributionMethod, register_method


@register_method
class GradientTimesInput(AttributionMethod):
    name, label, signed, pixels = "gradient", "Gradient × Input", True, True
    summary = "the plain gradient times the input (the baseline the LRP rules improve on); per pixel, signed"
