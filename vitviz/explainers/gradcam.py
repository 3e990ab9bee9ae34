"""Grad-CAM for ViTs with pytorch-grad-cam's recipe (the last block's ln1 activations, gradient-weighted)."""
from .base import AttributionMethod, register_method


@register_method
class GradCAM(AttributionMethod):
    name, label = "gradcam", "Grad-CAM"
    summary = "the last block's normalised tokens weighted by their mean gradient, ReLU (pytorch-grad-cam's ViT recipe)"
