"""LeGrad (Bousselham et al., CVPR 2025): each layer's attention gradient of the target read through the head."""
from .base import AttributionMethod, register_method


@register_method
class LeGrad(AttributionMethod):
    name, label = "legrad", "LeGrad"
    needs = ("gradients", "readout")
    summary = "per layer, the ReLU'd gradient of the target w.r.t. the attention, summed over layers; min-max 0..1"
