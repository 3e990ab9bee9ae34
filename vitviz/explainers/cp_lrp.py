"""CP-LRP (Ali et al., ICML 2022): AttnLRP with the attention probabilities held constant."""
from .base import AttributionMethod, register_method
from .relevance import relevance
from .rules import CPLRP


@register_method
class CPLRPMethod(AttributionMethod):
    name, label, signed, pixels = "cp-lrp", "CP-LRP", True, True
    rules = CPLRP
    summary = "relevance propagation with the softmax held constant (conservative propagation); per pixel, signed"

    def maps(self, model, x, target):
        return relevance(model, x, self.name, target)
