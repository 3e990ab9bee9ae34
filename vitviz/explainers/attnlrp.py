"""AttnLRP (Achtibat et al., ICML 2024) as lxt 2.1 computes it: see :mod:`vitviz.explainers.attribution`."""
from .base import AttributionMethod, register_method


@register_method
class AttnLRP(AttributionMethod):
    name, label, signed, pixels = "attnlrp", "AttnLRP", True, True
    summary = "relevance propagation through attention (lxt's rules as a modified gradient); per pixel, signed"
