"""Grad-CAM for ViTs with pytorch-grad-cam's recipe (the last block's ln1 activations, gradient-weighted)."""
from .base import AttributionMethod, block_of, register_method, target_text


@register_method
class GradCAM(AttributionMethod):
    name, label = "gradcam", "Grad-CAM"
    summary = "the last block's normalised tokens weighted by their mean gradient, ReLU (pytorch-grad-cam's ViT recipe)"

    def why_not_target(self, lens, target):
        """A target read inside the model (an SAE latent) must come at or after the last block's ln1 in the forward:
        a score computed before that point does not depend on it, and its gradient there does not exist."""
        point = getattr(target, "point", None)
        if point is None or block_of(point) is None:
            return None
        last = f"blocks.{lens.num_layers - 1}.ln1"
        order = lens.points()
        if point in order and order.index(point) >= order.index(last):
            return None
        return (f"Grad-CAM cannot explain {target_text(target)}: Grad-CAM weights the last block's ln1 activations "
                f"(layer {lens.num_layers}) by the target's gradient, and this target is read at {point} (layer "
                f"{block_of(point) + 1}), earlier in the forward, so it does not depend on them. Use AttnLRP, "
                "Gradient x Input, Integrated Gradients or occlusion, or an SAE on the last layer.")
