"""LeGrad (Bousselham et al., CVPR 2025): each layer's attention gradient of the target read through the head."""
from .base import AttributionMethod, block_of, register_method, target_text


@register_method
class LeGrad(AttributionMethod):
    name, label = "legrad", "LeGrad"
    needs = ("gradients", "readout")
    summary = "per layer, the ReLU'd gradient of the target w.r.t. the attention, summed over layers; min-max 0..1"

    def why_not_target(self, lens, target):
        """LeGrad scores the target on each layer's tokens read through the final norm and head: a target read inside
        the model (an SAE latent) is not computed by that readout."""
        point = getattr(target, "point", None)
        if point is None or block_of(point) is None:
            return None
        return (f"LeGrad cannot explain {target_text(target)}: LeGrad scores the target on each layer's tokens read "
                f"through the final norm and head, and this target is read at {point}, inside the model, which that "
                "readout never computes. Use AttnLRP, Gradient x Input, Integrated Gradients or occlusion.")
