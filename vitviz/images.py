"""Decode, validate and preprocess user images.

Uploads are untrusted: Pillow opens them lazily, the pixel count is checked from the header
before any decoding (decompression bombs), and every failure becomes an :class:`ImageError`
naming the file. :func:`load_images` never raises for a bad file: it returns the problems
beside the good images, so one bad file never stops the others.
"""
from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageError

MAX_PIXELS = 40_000_000
MIN_SIDE = 8
BACKGROUND = (255, 255, 255)


@dataclass
class LoadedImage:
    """A decoded RGB image and what was done to get it.

    Attributes:
        name: the file name the user gave.
        image: RGB, EXIF orientation applied.
        sha256: hash of the file bytes (keys caches, recorded in settings.json).
        notes: sentences about conversions, e.g. transparency composited, first frame used.
    """

    name: str
    image: Image.Image
    sha256: str
    notes: list[str] = field(default_factory=list)


def _to_rgb(im: Image.Image, background: tuple[int, int, int], notes: list[str]) -> Image.Image:
    """Every Pillow mode to 8-bit RGB."""
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = im.convert("RGBA")
        if rgba.getextrema()[3][0] < 255:
            notes.append(f"transparency composited on RGB{background}")
        canvas = Image.new("RGBA", rgba.size, background + (255,))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    if im.mode.startswith("I") or im.mode == "F":
        values = np.asarray(im, dtype=np.float64)
        if im.mode.startswith("I;16") or (im.mode == "I" and values.min() >= 0 and values.max() <= 65535):
            scaled = values / 65535.0
            notes.append("16-bit image scaled to 8 bits")
        else:
            lo, hi = float(values.min()), float(values.max())
            scaled = (values - lo) / (hi - lo) if hi > lo else np.zeros_like(values)
            notes.append(f"{im.mode} image min-max scaled to 8 bits")
        return Image.fromarray(np.round(scaled * 255).astype(np.uint8)).convert("RGB")
    if im.mode == "CMYK":
        notes.append("CMYK converted to RGB")
    return im.convert("RGB")


def load_image(source: bytes | str | Path, name: str | None = None, *, max_pixels: int = MAX_PIXELS,
               background: tuple[int, int, int] = BACKGROUND) -> LoadedImage:
    """Decode one image file into RGB.

    Args:
        source: the file's bytes, or a path.
        name: name to report; default the path's file name.
        max_pixels: refuse images with more pixels than this (decompression-bomb guard).
        background: RGB colour under transparent pixels.

    Raises:
        ImageError: the file is empty, not an image, truncated or corrupt, too large or too small.
    """
    if isinstance(source, (str, Path)):
        name = name or Path(source).name
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise ImageError(name, f"cannot be read ({exc.strerror or exc})") from exc
    else:
        data = bytes(source)
    name = name or "image"
    if not data:
        raise ImageError(name, "is empty (0 bytes)")

    notes: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            width, height = im.size
            if width * height > max_pixels:
                raise ImageError(name, f"is {width}x{height} = {width * height / 1e6:.1f} megapixels, over the "
                                       f"limit of {max_pixels / 1e6:.0f} megapixels (decompression-bomb guard)")
            if min(width, height) < MIN_SIDE:
                raise ImageError(name, f"is {width}x{height} pixels, too small (each side needs {MIN_SIDE}+)")
            frames = getattr(im, "n_frames", 1)
            if frames > 1:
                notes.append(f"animated ({frames} frames): the first frame is used")
            im.seek(0)
            im.load()
            im = ImageOps.exif_transpose(im)
    except ImageError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageError(name, "is not an image file Pillow can read") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(name, f"is over the limit of pixels Pillow decodes safely (decompression-bomb guard: {exc})") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(name, f"is truncated or corrupt ({str(exc).splitlines()[0][:120]})") from exc
    rgb = _to_rgb(im, background, notes)
    return LoadedImage(name=name, image=rgb, sha256=hashlib.sha256(data).hexdigest(), notes=notes)


def load_images(sources, **kwargs) -> tuple[list[LoadedImage], list[ImageError]]:
    """Decode many files; bad ones are returned as errors, never raised.

    Args:
        sources: iterable of paths or ``(name, bytes)`` pairs.
        kwargs: passed to :func:`load_image`.

    Returns:
        (good images in input order, one ImageError per bad file).
    """
    good, bad = [], []
    for source in sources:
        data, name = (source[1], source[0]) if isinstance(source, tuple) else (source, None)
        try:
            good.append(load_image(data, name, **kwargs))
        except ImageError as exc:
            bad.append(exc)
    return good, bad


@dataclass
class ModelInput:
    """A batch ready for the model.

    Attributes:
        tensor: (B, 3, H, W) float32, normalised with the model's mean/std.
        images: the exact model-input images (after resize and crop), RGB, H x W: overlays go on these.
    """

    tensor: torch.Tensor
    images: list[Image.Image]


def _split_transform(data_config: dict):
    """timm's eval transform, split into the geometric part (PIL -> PIL) and the tensor part."""
    from timm.data import create_transform

    steps = create_transform(**data_config, is_training=False).transforms
    cut = next(i for i, t in enumerate(steps) if "ToTensor" in type(t).__name__)
    return steps[:cut], steps[cut:]


def preprocess(images: list[Image.Image], data_config: dict) -> ModelInput:
    """Resize, crop and normalise RGB images with the model's timm data config.

    images: B RGB images -> ModelInput with tensor (B, 3, H, W).
    """
    geometric, to_tensor = _split_transform(data_config)
    resized, tensors = [], []
    for im in images:
        for step in geometric:
            im = step(im)
        resized.append(im)
        t = im
        for step in to_tensor:
            t = step(t)
        tensors.append(t)
    return ModelInput(tensor=torch.stack(tensors), images=resized)
