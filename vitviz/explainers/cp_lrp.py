"""CP-LRP (Ali et al., ICML 2022): AttnLRP with the attention probabilities held constant."""
from .base import AttributionMethod, register_method


@register_method
class CPLRP(AttributionMethod):
    name, label, signed, pixels = "cp-lrp", "CP-LRP", True, True
    summary = "relevance propagation with the softmax held constant (conservative propagation); per pixel, signed"
