"""AttnLRP (Achtibat et al., ICML 2024) as lxt 2.1 computes it: :class:`vitviz.explainers.rules.AttnLRP`."""
from .base import AttributionMethod, register_method
from .relevance import relevance
from .rules import AttnLRP


@register_method
class AttnLRPMethod(AttributionMethod):
    name, label, signed, pixels = "attnlrp", "AttnLRP", True, True
    rules = AttnLRP
    summary = "relevance propagation through attention (lxt's rules as a modified gradient); per pixel, signed"

    def maps(self, model, x, target):
        return relevance(model, x, self.name, target)
