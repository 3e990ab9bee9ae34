"""PNG renderings of the analyses for ``--report``, drawn with Pillow (no browser needed)."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from .colour import lookup_table


def tile_grid(tiles: np.ndarray, columns: int, scale: int = 1, gap: int = 2) -> Image.Image:
    """(k, h, w, 3) floats in [0, 1] or uint8 -> one image of tiles, row by row."""
    tiles = tiles if tiles.dtype == np.uint8 else np.round(np.clip(tiles, 0, 1) * 255).astype(np.uint8)
    k, h, w, _ = tiles.shape
    rows = -(-k // columns)
    th, tw = h * scale, w * scale
    out = Image.new("RGB", (columns * (tw + gap) - gap, rows * (th + gap) - gap), "white")
    for i, tile in enumerate(tiles):
        out.paste(Image.fromarray(tile).resize((tw, th), Image.NEAREST), ((i % columns) * (tw + gap), (i // columns) * (th + gap)))
    return out


def distance_plot(distance: np.ndarray, receptive_field: np.ndarray | None = None,
                  size: tuple[int, int] = (640, 420)) -> Image.Image:
    """ViT paper Fig. 7 right: depth on x, mean attention distance (px) on y, one dot per head.

    distance: (L, H) pixels; receptive_field: (L,) pixels of a 3x3 conv stack, drawn as a line.
    """
    W, H = size
    left, right, top, bottom = 60, 20, 20, 45
    L = distance.shape[0]
    ymax = max(float(distance.max()), float(receptive_field.max()) if receptive_field is not None else 0) * 1.08 or 1
    im = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(im)

    def xy(layer: float, value: float) -> tuple[float, float]:
        x = left + (layer + 0.5) / L * (W - left - right)
        return x, top + (1 - value / ymax) * (H - top - bottom)

    draw.line([(left, top), (left, H - bottom), (W - right, H - bottom)], fill="black")
    for t in np.linspace(0, ymax, 5):
        _, y = xy(0, t)
        draw.line([(left - 4, y), (left, y)], fill="black")
        draw.text((4, y - 6), f"{t:.0f}", fill="black")
    for layer in range(L):
        x, _ = xy(layer, 0)
        draw.text((x - 4, H - bottom + 6), str(layer + 1), fill="black")
    draw.text((W // 2 - 50, H - 18), "network depth (layer)", fill="black")
    draw.text((4, 2), "mean attention distance (px)", fill="black")
    if receptive_field is not None:
        draw.line([xy(l, v) for l, v in enumerate(receptive_field)], fill=(150, 150, 150), width=2)
    colours = lookup_table("Viridis")[np.linspace(0, 255, distance.shape[1]).astype(int)]
    for layer in range(L):
        for head, value in enumerate(distance[layer]):
            x, y = xy(layer, float(value))
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=tuple(int(c) for c in colours[head]))
    return im


def outline_patch(image: Image.Image, patch: int | None, grid_size: tuple[int, int], scale: int = 1,
                  colour: str = "cyan") -> Image.Image:
    """The image enlarged ``scale`` times with one patch outlined (for click-to-pick views)."""
    out = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
    if patch is not None:
        ph, pw = out.height // grid_size[0], out.width // grid_size[1]
        r, c = divmod(int(patch), grid_size[1])
        ImageDraw.Draw(out).rectangle([c * pw, r * ph, (c + 1) * pw - 1, (r + 1) * ph - 1], outline=colour, width=3)
    return out
