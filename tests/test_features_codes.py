"""What the Features page reads from an image set's latent codes (vitviz.features.browse.Codes), on codes written
by hand: 2 images, a 2x3 grid, 2 slots per patch, 4 latents."""
import numpy as np

from vitviz.features.browse import Codes


def _codes() -> Codes:
    values = np.zeros((2, 6, 2), np.float32)
    index = np.zeros((2, 6, 2), np.int32)
    # image 0: latent 2 fires at patches 1 (0.5), 4 (0.9) and 5 (0.9, a tie with 4); latent 3 at patch 0 (2.0)
    values[0, 1], index[0, 1] = (0.5, 0.0), (2, 0)
    values[0, 4], index[0, 4] = (0.9, 0.3), (2, 1)
    values[0, 5], index[0, 5] = (0.9, 0.0), (2, 0)
    values[0, 0], index[0, 0] = (2.0, 0.1), (3, 1)
    # image 1: latent 1 fires at patch 3 only, in the second slot
    values[1, 3], index[1, 3] = (0.7, 0.2), (0, 1)
    return Codes(values, index, (2, 3), 4)


def test_the_strongest_patch_of_a_latent_is_its_largest_activation_on_that_image():
    codes = _codes()
    assert codes.strongest_patch(0, 2) == 4  # 0.9 at 4 and 5: the lower index
    assert codes.strongest_patch(0, 3) == 0
    assert codes.strongest_patch(1, 1) == 3  # read from the second slot
    assert codes.strongest_patch(0, 1) == 4  # latent 1's 0.3 at patch 4 (second slot), not latent 2's 0.9
    assert codes.strongest_patch(1, 2) == 0  # not firing on image 1: patch 0


def test_the_latents_at_a_patch_are_those_that_fire_there_strongest_first():
    codes = _codes()
    assert codes.patch_latents(0, 4) == [(2, np.float32(0.9)), (1, np.float32(0.3))]
    assert codes.patch_latents(1, 3) == [(0, np.float32(0.7)), (1, np.float32(0.2))]
    assert codes.patch_latents(0, 2) == []
