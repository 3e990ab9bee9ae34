"""Ingestion: a corpus of bad and odd files, each with the right message; good files still load."""
import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import ASSETS
from vitviz.errors import ImageError
from vitviz.io.images import load_image, load_images
from vitviz.sources.preprocess import preprocess


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _gradient(size=(64, 48)) -> Image.Image:
    w, h = size
    x = np.linspace(0, 255, w, dtype=np.uint8)[None, :].repeat(h, 0)
    return Image.fromarray(np.stack([x, x[::-1, ::-1], np.full_like(x, 90)], -1))


def _png_header_only(width, height) -> bytes:
    """A valid PNG signature + IHDR claiming a huge size, no pixel data (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def _exif_rotated() -> bytes:
    im = Image.new("RGB", (40, 20), (255, 0, 0))
    im.paste((0, 0, 255), (0, 0, 20, 20))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return _encode(im, "JPEG", exif=exif, quality=95)


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (32, 32), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buf.getvalue()


def _rgba_half_transparent() -> bytes:
    im = Image.new("RGBA", (32, 32), (255, 0, 0, 255))
    im.paste((0, 0, 0, 0), (0, 0, 16, 32))
    return _encode(im, "PNG")


def _palette_with_transparency() -> bytes:
    im = Image.new("P", (32, 32), 0)
    im.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    im.paste(1, (16, 0, 32, 32))
    return _encode(im, "PNG", transparency=0)


GOOD_JPEG = _encode(_gradient(), "JPEG")
GOOD_PNG = _encode(_gradient(), "PNG")

# name -> (bytes, expected message fragment)
BAD = {
    "empty.jpg": (b"", "is empty (0 bytes)"),
    "notes.txt": (b"just some text, not pixels\n" * 10, "not an image"),
    "random.png": (bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)), "not an image"),
    "script.jpg": (b"#!/bin/sh\nrm -rf /\n", "not an image"),
    "html.png": (b"<html><body>404</body></html>", "not an image"),
    "truncated.jpg": (GOOD_JPEG[: len(GOOD_JPEG) // 2], "truncated or corrupt"),
    "truncated.png": (GOOD_PNG[: len(GOOD_PNG) // 2], "truncated or corrupt"),
    "header_only.png": (GOOD_PNG[:60], "truncated or corrupt"),
    "bomb.png": (_png_header_only(60000, 60000), "over the limit"),
    "wide_bomb.png": (_png_header_only(200000, 1000), "over the limit"),
    "tiny.png": (_encode(Image.new("RGB", (2, 2)), "PNG"), "too small"),
    "one_pixel.gif": (_encode(Image.new("P", (1, 1)), "GIF"), "too small"),
    "line.png": (_encode(Image.new("RGB", (500, 1)), "PNG"), "too small"),
    "corrupt_body.png": (GOOD_PNG[:40] + b"\x00" * (len(GOOD_PNG) - 40), "corrupt"),
}

# name -> (bytes, expected RGB at (x, y) after loading, expected note fragment or None)
ODD = {
    "rgba.png": (_rgba_half_transparent(), ((4, 4), (255, 255, 255)), "transparency composited"),
    "palette_transparent.png": (_palette_with_transparency(), ((4, 4), (255, 255, 255)), "transparency"),
    "gray.png": (_encode(Image.new("L", (32, 32), 100), "PNG"), ((3, 3), (100, 100, 100)), None),
    "gray16.png": (_encode(Image.fromarray(np.full((32, 32), 65535, np.uint16)), "PNG"), ((3, 3), (255, 255, 255)), "16-bit"),
    "la.png": (_encode(Image.new("LA", (32, 32), (50, 255)), "PNG"), ((3, 3), (50, 50, 50)), None),
    "cmyk.jpg": (_encode(Image.new("CMYK", (32, 32), (0, 255, 255, 0)), "JPEG", quality=100), ((3, 3), (255, 0, 0)), "CMYK"),
    "animated.gif": (_animated_gif(), ((3, 3), (255, 0, 0)), "first frame"),
    "bilevel.bmp": (_encode(Image.new("1", (32, 32), 1), "BMP"), ((3, 3), (255, 255, 255)), None),
    "float.tiff": (_encode(Image.fromarray(np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)), "TIFF"), ((31, 31), (255, 255, 255)), "min-max"),
    "photo.webp": (_encode(_gradient(), "WEBP", lossless=True), ((0, 0), tuple(np.asarray(_gradient())[0, 0])), None),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_file_gets_its_own_message(name):
    data, fragment = BAD[name]
    with pytest.raises(ImageError) as info:
        load_image(data, name)
    assert str(info.value).startswith(f"{name}: ")
    assert fragment in str(info.value)


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_file_becomes_rgb(name):
    data, ((x, y), rgb), note = ODD[name]
    loaded = load_image(data, name)
    assert loaded.image.mode == "RGB"
    got = loaded.image.getpixel((x, y))
    assert np.allclose(got, rgb, atol=3), got
    if note:
        assert any(note in n for n in loaded.notes), loaded.notes


def test_exif_orientation_is_applied():
    loaded = load_image(_exif_rotated(), "rotated.jpg")
    assert loaded.image.size == (20, 40)  # portrait after rotation
    top, bottom = loaded.image.getpixel((10, 5)), loaded.image.getpixel((10, 35))
    assert top[2] > 200 and top[0] < 60  # the blue half is on top after a 90 degree clockwise turn
    assert bottom[0] > 200 and bottom[2] < 60


def test_bad_files_never_stop_the_good_ones():
    sources = [(n, b) for n, (b, _) in BAD.items()] + [("good.jpg", GOOD_JPEG), ("good.png", GOOD_PNG)]
    good, bad = load_images(sources)
    assert [g.name for g in good] == ["good.jpg", "good.png"]
    assert sorted(e.name for e in bad) == sorted(BAD)
    assert len(BAD) + len(ODD) >= 20


def test_pixel_limit_is_a_setting():
    with pytest.raises(ImageError, match="over the limit of 0 megapixels"):
        load_image(GOOD_PNG, "small.png", max_pixels=100)


def test_paths_and_missing_files():
    assert load_image(ASSETS / "chelsea.jpg").name == "chelsea.jpg"
    with pytest.raises(ImageError, match="^nope.jpg: cannot be read"):
        load_image(ASSETS / "nope.jpg")


def test_sha256_identifies_the_bytes():
    import hashlib

    assert load_image(GOOD_PNG, "a.png").sha256 == hashlib.sha256(GOOD_PNG).hexdigest()


def test_preprocess_keeps_the_exact_model_input_image():
    from timm.data import resolve_data_config

    config = resolve_data_config({"input_size": (3, 32, 32), "crop_pct": 1.0, "interpolation": "bicubic",
                                  "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)})
    wide = Image.new("RGB", (96, 48), (0, 0, 0))
    wide.paste((255, 255, 255), (24, 0, 72, 48))  # white centre square, black side bands
    batch = preprocess([wide], config)
    assert batch.images[0].size == (32, 32)
    assert batch.tensor.shape == (1, 3, 32, 32)
    # The centre crop keeps only the white square; the tensor is that image normalised.
    expected = (torch.from_numpy(np.asarray(batch.images[0], np.float32) / 255).permute(2, 0, 1) - 0.5) / 0.25
    assert torch.allclose(batch.tensor[0], expected, atol=1e-6)
    assert batch.tensor[..., 2:-2].min() > 1.99  # (1 - 0.5) / 0.25 = 2: white, bands cropped away
