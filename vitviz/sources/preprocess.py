"""A model's preprocessing: resize, crop and normalise RGB images the way the model was trained to see them.

timm's eval transform for timm and torchvision models (their data config), a transformers model's own image
processor for Hugging Face models. The images come decoded and checked from :mod:`vitviz.io.images`; each
geometric step is refused before it allocates when its output would be over the pixel limit.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..errors import ImageError
from ..io.images import MAX_PIXELS, LoadedImage, _scaled_pixels
from ..types import ModelInput


def _split_transform(data_config: dict):
    """timm's eval transform, split into the geometric part (PIL -> PIL) and the tensor part."""
    from timm.data import create_transform

    steps = create_transform(**data_config, is_training=False).transforms
    cut = next(i for i, t in enumerate(steps) if "ToTensor" in type(t).__name__)
    return steps[:cut], steps[cut:]


def preprocess(images: list[Image.Image], data_config: dict) -> ModelInput:
    """Resize, crop and normalise RGB images with the model's timm data config.

    images: B RGB images -> ModelInput with tensor (B, 3, H, W).
    A transformers model's data config (with ``hf_processor``) runs its own image processor
    (:func:`vitviz.sources.hf.preprocess`).
    """
    if "hf_processor" in data_config:
        from . import hf

        return hf.preprocess(images, data_config)
    geometric, to_tensor = _split_transform(data_config)
    resized, tensors = [], []
    for im in images:
        for step in geometric:
            _check_step_size(step, im.size)
            im = step(im)
        resized.append(im)
        t = im
        for step in to_tensor:
            t = step(t)
        tensors.append(t)
    return ModelInput(tensor=torch.stack(tensors), images=resized)


def _check_step_size(step, size: tuple[int, int]) -> None:
    """Refuse a resize or crop step whose output would be over :data:`MAX_PIXELS`, before it allocates.

    A resize to a short side ``s`` gives s * s * aspect pixels; a fixed (h, w) gives h * w; a crop
    at most its size. Unknown geometric steps are bounded like a resize to their largest ``size``.
    """
    target = getattr(step, "size", None)
    if target is None:
        return
    sides = [target] if isinstance(target, int) else list(target)
    kind = type(step).__name__
    if "Crop" in kind or (kind == "Resize" and len(sides) == 2):
        pixels = sides[0] * sides[-1]
    else:
        pixels = _scaled_pixels(size, max(sides))
    if pixels > MAX_PIXELS:
        w, h = size
        raise ImageError(f"{w}x{h} image", f"would become {pixels / 1e6:.0f} megapixels in the model's "
                                           f"{kind} step, over the limit of {MAX_PIXELS / 1e6:.0f} megapixels")


def padding_patches(loaded: LoadedImage, data_config: dict, grid_size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) bool: the patches of the model input that hold padding only, not one pixel of the photo.

    The padded square's photo box is drawn white on black and put through the model's own preprocessing
    (:func:`preprocess`: its resize and crop); a patch is padding when every one of its pixels stays black. A patch
    that resampling gave a trace of the photo's edge counts as photo. Row-major, as the patch grid; all False when
    ``loaded`` was not padded.

    Args:
        loaded: an image after :func:`vitviz.io.images.frame_image` (its ``content_box``).
        data_config: the model's preprocessing (timm data config, or a transformers image processor's).
        grid_size: (gh, gw) patches of the model input.
    """
    gh, gw = grid_size
    if loaded.content_box is None:
        return np.zeros((gh, gw), dtype=bool)
    marker = Image.new("RGB", loaded.image.size, (0, 0, 0))
    marker.paste((255, 255, 255), loaded.content_box)
    seen = np.asarray(preprocess([marker], data_config).images[0].convert("L"))
    ph, pw = seen.shape[0] // gh, seen.shape[1] // gw
    return seen[:gh * ph, :gw * pw].reshape(gh, ph, gw, pw).max(axis=(1, 3)) == 0

