"""Decode and validate user images (preprocessing for a model is :mod:`vitviz.sources.preprocess`).

Uploads are untrusted: Pillow opens them lazily, the pixel count is checked from the header
before any decoding (decompression bombs), and every failure becomes an :class:`ImageError`
naming the file. :func:`load_images` never raises for a bad file: it returns the problems
beside the good images, so one bad file never stops the others.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ImageError, OptionError, first_line

MAX_PIXELS = 40_000_000
MIN_SIDE = 8
# A strip of 700000x8 pixels is only 5.6 MP, but scaled to a 224 px short side it is 19.6 Mx224.
MAX_ASPECT_RATIO = 100
# The padded square is only ever shrunk to the model input: pad at most this side, never a huge canvas.
MAX_PAD_SIDE = 4096
BACKGROUND = (255, 255, 255)
FRAMINGS = ("crop", "pad")


@dataclass
class LoadedImage:
    """A decoded RGB image and what was done to get it.

    Attributes:
        name: the file name the user gave.
        image: RGB, EXIF orientation applied.
        sha256: hash of the file bytes (keys caches, recorded in settings.json); ``":pad"`` is
            appended once :func:`frame_image` padded the image, so crop and pad results never mix.
        notes: sentences about conversions, e.g. transparency composited, first frame used.
        content_box: (left, top, right, bottom) pixels of ``image`` that hold the photo once
            :func:`frame_image` padded it (the rest is padding); None: all of it is the photo.
    """

    name: str
    image: Image.Image
    sha256: str
    notes: list[str] = field(default_factory=list)
    content_box: tuple[int, int, int, int] | None = None


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


def _scaled_pixels(size: tuple[int, int], short_side: int) -> int:
    """Pixels of an image of ``size`` with its shorter side scaled to ``short_side``."""
    w, h = size
    return int(short_side * short_side * max(w, h) / min(w, h))


def _deep_colour(im: Image.Image) -> str | None:
    """A note when Pillow opens a 16-bit-per-channel colour image as 8-bit RGB(A) (it keeps the high byte)."""
    if im.mode not in ("RGB", "RGBA"):
        return None
    for tile in getattr(im, "tile", None) or []:
        args = tile.args if hasattr(tile, "args") else tile[3]
        raw = args if isinstance(args, str) else (args[0] if args and isinstance(args[0], str) else "")
        if ";16" in raw:
            bits = 16 * len(im.mode)
            return f"{bits}-bit {im.mode} (16 bits per channel) reduced to 8 bits per channel"
    return None


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
            if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                ratio = max(width, height) / min(width, height)
                raise ImageError(name, f"is {width}x{height} pixels, an aspect ratio of {ratio:.0f}:1, over the "
                                       f"limit of {MAX_ASPECT_RATIO}:1 (scaled for the model it would take "
                                       f"{_scaled_pixels((width, height), 224) / 1e6:.0f} megapixels)")
            deep = _deep_colour(im)
            if deep:
                notes.append(deep)
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
        raise ImageError(name, f"is truncated or corrupt ({first_line(exc, 120)})") from exc
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


def model_view(size: tuple[int, int], data_config: dict) -> tuple[float, float]:
    """The part of an image the model's eval transform keeps, in the image's own pixels.

    Mirrors timm's ``transforms_imagenet_eval``: scale to ``input_size / crop_pct`` (shorter side
    for ``crop_mode="center"``, longer side for ``"border"``, each side for ``"squash"``), then
    take the centred ``input_size``.

    Args:
        size: (width, height) of the image.
        data_config: timm data config (``input_size``, ``crop_pct``, ``crop_mode``).

    Returns:
        (width, height) of the centred region the model sees, at most ``size``.
    """
    w, h = size
    border = data_config.get("crop_border_pixels") or 0
    w, h = w - 2 * border, h - 2 * border
    _, height, width = data_config["input_size"]
    crop_pct = data_config.get("crop_pct") or 0.875  # timm's DEFAULT_CROP_PCT
    scale_h, scale_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    mode = data_config.get("crop_mode") or "center"
    if mode == "squash":
        return w * width / scale_w, h * height / scale_h
    factor = (min if mode == "border" else max)(scale_h / h, scale_w / w)
    return min(width / factor, w), min(height / factor, h)


def visible_share(size: tuple[int, int], data_config: dict) -> float:
    """Share (0..1] of an image's area that the model sees after its resize and centre crop."""
    seen_w, seen_h = model_view(size, data_config)
    return seen_w * seen_h / (size[0] * size[1])


def pad_to_square(image: Image.Image, fill: tuple[int, int, int] = (0, 0, 0)) -> Image.Image:
    """The whole image centred on a square canvas of its longer side, so a centre crop keeps all of it.

    Args:
        image: RGB, W x H.
        fill: RGB of the added bands; the model's mean colour (``round(255 * mean)``, as timm's
            ``crop_mode="border"`` pads) normalises to zero, i.e. no signal.

    Returns:
        RGB, S x S with S = max(W, H) (images longer than :data:`MAX_PAD_SIDE` are scaled to it
        first); ``image`` itself when it is already square.
    """
    w, h = image.size
    if w == h:
        return image
    if max(w, h) > MAX_PAD_SIDE:
        scale = MAX_PAD_SIDE / max(w, h)
        w, h = max(1, round(w * scale)), max(1, round(h * scale))
        image = image.resize((w, h), Image.Resampling.BICUBIC, reducing_gap=3.0)
    canvas = Image.new("RGB", (max(w, h),) * 2, tuple(int(c) for c in fill))
    canvas.paste(image, _pad_box((w, h))[:2])
    return canvas


def _pad_box(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a W x H image centred on its padded square (as :func:`pad_to_square` places
    it, after any scaling to :data:`MAX_PAD_SIDE`)."""
    w, h = size
    side = max(w, h)
    left, top = (side - w) // 2, (side - h) // 2
    return left, top, left + w, top + h


def mean_colour(data_config: dict) -> tuple[int, int, int]:
    """The model's normalisation mean as an 8-bit RGB colour."""
    return tuple(round(255 * m) for m in data_config["mean"])


def frame_image(loaded: LoadedImage, framing: str, fill: tuple[int, int, int] = (0, 0, 0)) -> LoadedImage:
    """The image as it goes into :func:`preprocess` for a framing choice.

    Args:
        loaded: a decoded image.
        framing: ``"crop"`` (the model's own centre crop: ``loaded`` unchanged) or ``"pad"``
            (:func:`pad_to_square` first, so the model sees the whole image, smaller).
        fill: RGB of the padding.
    """
    if framing not in FRAMINGS:
        raise OptionError(f"framing must be one of {FRAMINGS}, not {framing!r}")
    if framing == "crop" or loaded.image.width == loaded.image.height:
        return loaded
    w, h = loaded.image.size
    padded = pad_to_square(loaded.image, fill)
    scaled = f" (scaled to a {padded.width} px side first)" if padded.width < max(w, h) else ""
    note = (f"padded from {w}x{h} to {padded.width}x{padded.height} with RGB{tuple(fill)}{scaled} "
            "so the model sees all of it")
    shrink = padded.width / max(w, h)
    box = _pad_box((max(1, round(w * shrink)), max(1, round(h * shrink))) if shrink < 1 else (w, h))
    return dataclasses.replace(loaded, image=padded, sha256=f"{loaded.sha256}:pad", notes=[*loaded.notes, note],
                               content_box=box)

