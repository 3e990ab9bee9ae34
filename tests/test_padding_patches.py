"""Issue 34: with "resize whole image (pad)" the patches that are padding only are known from the geometry, so the
pages can mark them and keep them out of colour scales and rollout as they do sinks."""
import numpy as np
from PIL import Image

from vitviz.io.images import LoadedImage, frame_image
from vitviz.sources.preprocess import padding_patches

# A ViT-B/16-style preprocessing: resize the short side to floor(224 / 0.875) = 256, centre crop 224.
CONFIG = {"input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.875, "crop_mode": "center",
          "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
GRID = (14, 14)  # 16 px patches


def _padded(w: int, h: int) -> LoadedImage:
    photo = Image.new("RGB", (w, h), (200, 30, 30))
    return frame_image(LoadedImage("photo.png", photo, "sha"), "pad", (124, 116, 104))


def test_padding_patches_of_a_wide_photo_are_the_bands_above_and_below_it():
    # 300 x 120 on a 300 px square: the photo's rows 90..210. Resized by 256/300: 76.8..179.2; the crop starts
    # at (256 - 224) / 2 = 16: rows 60.8..163.2 of the model input. 16 px patch rows: rows 0-2 (0..48) hold no
    # photo, row 3 (48..64) and row 10 (160..176) hold some; rows 11-13 (176..224) none: 12.8 px from the photo
    # on either side, beyond any resampling spread.
    loaded = _padded(300, 120)
    assert loaded.content_box == (0, 90, 300, 210)
    expected = np.zeros(GRID, bool)
    expected[[0, 1, 2, 11, 12, 13], :] = True
    mask = padding_patches(loaded, CONFIG, GRID)
    np.testing.assert_array_equal(mask, expected)
    assert mask.sum() == 6 * 14


def test_padding_patches_of_a_tall_photo_are_the_bands_beside_it():
    # 101 x 224 on a 224 px square, the model input at its own size (crop_pct 1: no resize, no crop): the photo's
    # columns 61..162 ((224 - 101) // 2 = 61). 14 px patch columns (16 x 16 grid): 0-3 end at 56 (padding), 4
    # (56..70) and 11 (154..168) hold photo, 12-15 start at 168 (padding).
    loaded = _padded(101, 224)
    config = CONFIG | {"crop_pct": 1.0}
    expected = np.zeros((16, 16), bool)
    expected[:, [0, 1, 2, 3, 12, 13, 14, 15]] = True
    np.testing.assert_array_equal(padding_patches(loaded, config, (16, 16)), expected)


def test_an_image_that_is_not_padded_has_no_padding_patches():
    square = _padded(200, 200)  # already square: nothing added
    assert square.content_box is None
    assert not padding_patches(square, CONFIG, GRID).any()
    cropped = frame_image(LoadedImage("p.png", Image.new("RGB", (300, 120)), "sha"), "crop")
    assert not padding_patches(cropped, CONFIG, GRID).any()
