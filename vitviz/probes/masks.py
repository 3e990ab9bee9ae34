"""Mask PNGs of painted concepts, as the CLI reads them (``probe INPUT... --patch-masks DIR``).

For an image ``photos/chelsea.jpg``, ``DIR/chelsea.png`` marks the concept (white = concept, black = not) and
the optional ``DIR/chelsea.not.png`` marks not-concept patches (white = not concept; then the patches white in
neither are left out: :data:`vitviz.probes.concepts.LABEL_RULE`). An image without a mask takes no part in
training and is only mapped. A mask is either the image's own size — it then goes through the model's resize and
crop exactly as the image does, and a patch is marked when at least half of its pixels are white (grey >= 128) —
or exactly the patch grid, one pixel per patch (gw x gh pixels). Anything else is refused with a sentence naming
the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..io.inputs import IMAGE_SUFFIXES
from .painted import ConceptError, PaintedImages

NOT_SUFFIX = ".not"


def image_paths(inputs: list[str | Path]) -> list[Path]:
    """Image files given directly or found in folders (not recursively), sorted within each folder.

    Raises:
        ConceptError: an INPUT that does not exist, a folder without images, or two images with one name stem (their
            masks would be one file).
    """
    paths = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise ConceptError(f"{item} holds no images ({', '.join(IMAGE_SUFFIXES)}).")
            paths.extend(found)
        elif item.is_file():
            paths.append(item)
        else:
            raise ConceptError(f"{item} does not exist.")
    seen = {}
    for p in paths:
        if p.stem in seen:
            raise ConceptError(f"{seen[p.stem]} and {p} have the same name stem {p.stem!r}: their masks would both be "
                               f"{p.stem}.png; rename one.")
        seen[p.stem] = p
    return paths


def read_mask(path: Path, image_size: tuple[int, int], grid_size: tuple[int, int], to_model_input) -> np.ndarray:
    """One mask PNG -> (gh, gw) bool on the model's patch grid.

    Args:
        image_size: (W, H) of the image the mask belongs to.
        grid_size: (gh, gw).
        to_model_input: PIL image -> the model-input PIL image (the model's resize and crop).

    Raises:
        ConceptError: unreadable, or neither the image's size nor the grid's (the sentence names the file).
    """
    gh, gw = grid_size
    try:
        with Image.open(path) as im:
            im.load()
            mask = im.convert("L")
    except Exception as exc:  # noqa: BLE001 - any decoding failure: say which file
        raise ConceptError(f"{path} cannot be read as a mask image ({exc}).") from None
    if mask.size == (gw, gh):
        return np.asarray(mask) >= 128
    if mask.size != tuple(image_size):
        raise ConceptError(f"{path} is {mask.size[0]}x{mask.size[1]} pixels; a mask is the size of its image "
                           f"({image_size[0]}x{image_size[1]}) or of the patch grid ({gw}x{gh}, one pixel per patch).")
    binary = Image.fromarray(np.where(np.asarray(mask) >= 128, 255, 0).astype(np.uint8)).convert("RGB")
    model_input = np.asarray(to_model_input(binary).convert("L"), dtype=np.float64) / 255
    H, W = model_input.shape
    ph, pw = H // gh, W // gw
    cells = model_input[:gh * ph, :gw * pw].reshape(gh, ph, gw, pw).mean(axis=(1, 3))
    return cells >= 0.5


def painted_from_masks(lens, inputs: list[str | Path], folder: str | Path) -> PaintedImages:
    """The images of ``inputs`` with the masks of ``folder`` (see the module's docstring).

    Raises:
        ConceptError: a missing folder, a mask for an image that is not among the inputs, a mask of the wrong size,
            or no mask at all (each sentence names the file).
    """
    from ..io.images import load_image
    from ..errors import ImageError

    folder = Path(folder)
    if not folder.is_dir():
        raise ConceptError(f"--patch-masks {folder} is not a folder: it holds one PNG per painted image, named like "
                           "the image (chelsea.jpg -> chelsea.png).")
    paths = image_paths(inputs)
    stems = {p.stem for p in paths}
    masks = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".png")
    for mask in masks:
        stem = mask.stem.removesuffix(NOT_SUFFIX)
        if stem not in stems:
            raise ConceptError(f"{mask} is a mask for {stem}, which is not among the images given "
                               f"({', '.join(sorted(stems))}).")
    if not masks:
        raise ConceptError(f"{folder} holds no mask PNGs: paint the concept white on a PNG named like its image "
                           "(chelsea.jpg -> chelsea.png).")
    grid = tuple(lens.layout.grid_size)

    def to_model_input(image):
        return lens.preprocess([image]).images[0]

    images, concept, not_concept = [], [], []
    for path in paths:
        try:
            loaded = load_image(path, str(path))
        except ImageError as exc:
            raise ConceptError(str(exc)) from None
        images.append(loaded)
        c, n = folder / f"{path.stem}.png", folder / f"{path.stem}{NOT_SUFFIX}.png"
        concept.append(read_mask(c, loaded.image.size, grid, to_model_input) if c.is_file() else None)
        not_concept.append(read_mask(n, loaded.image.size, grid, to_model_input) if n.is_file() else None)
    return PaintedImages.of(images, concept, not_concept, names=[str(p) for p in paths])
