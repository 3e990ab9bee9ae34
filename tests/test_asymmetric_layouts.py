"""Two bug classes a square, CLS-only test model cannot see (docs/planted-bugs.md): the position table of
models whose prefix tokens carry no position row (registers, ``no_embed_class``), and perturbation masks of
non-square patches. Each reference is the library's own forward (timm's ``_pos_embed``, its checkpoint filter,
its patch embedding), on inputs asymmetric enough that a swapped or miscounted formula gives another answer."""
import numpy as np
import pytest
import timm
import torch
from timm.models.vision_transformer import checkpoint_filter_fn

from vitviz.perturbation.curves import patch_masks, perturb, pixel_masks
from vitviz.layout import TokenLayout
from vitviz.analyses.posembed import patch_position_embeddings

TINY = dict(pretrained=False, depth=1, embed_dim=32, num_heads=2)
# (name, img_size): grids of 5 x 3 (patch 14) or 4 x 3 (patch 16), never square, so rows and columns cannot trade.
POSITION_MODELS = {
    "registers (cls + 4 registers, no position rows)": ("vit_small_patch14_reg4_dinov2", (70, 42)),
    "no_embed_class, cls only (DeiT-III)": ("deit3_small_patch16_224", (64, 48)),
    "two prefix rows (distilled DeiT)": ("deit_tiny_distilled_patch16_224", (64, 48)),
}


def _model(name: str, img_size, seed: int = 0):
    torch.manual_seed(seed)
    model = timm.create_model(name, img_size=img_size, **TINY).eval()
    with torch.no_grad():
        model.pos_embed.normal_()  # every row distinct: a row taken from the wrong place shows
    return model


@pytest.mark.parametrize("name, img_size", POSITION_MODELS.values(), ids=POSITION_MODELS.keys())
def test_position_rows_are_the_rows_the_model_adds_to_its_patch_tokens(name, img_size):
    model = _model(name, img_size)
    layout = TokenLayout.from_model(model)
    gh, gw = layout.grid_size
    with torch.no_grad():  # timm's own step: patch tokens of zeros come out as their position rows
        added = model._pos_embed(torch.zeros(1, gh * gw, model.embed_dim))[0, model.num_prefix_tokens:]
    rows = patch_position_embeddings(model, layout)
    assert rows.shape == (gh * gw, model.embed_dim)
    np.testing.assert_array_equal(rows, added.numpy())


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "deit_tiny_distilled_patch16_224"])
def test_position_rows_resampled_to_another_grid_equal_timms_loader(name):
    patch = 14 if "patch14" in name else 16
    model = _model(name, (5 * patch, 5 * patch))  # timm's checkpoint filter reads a stored grid as square
    layout = TokenLayout.from_model(model)
    other = timm.create_model(name, img_size=(4 * patch, 6 * patch), **TINY).eval()
    other.load_state_dict(checkpoint_filter_fn(model.state_dict(), other))
    with torch.no_grad():
        added = other._pos_embed(torch.zeros(1, 24, model.embed_dim))[0, model.num_prefix_tokens:]
    # Both sides run timm's resample_abs_pos_embed on the same rows: equal to float32 rounding of one bicubic pass.
    np.testing.assert_allclose(patch_position_embeddings(model, layout, grid_size=(4, 6)), added.numpy(),
                               rtol=0, atol=1e-5)


def test_deleted_patches_of_8x16_pixels_are_the_ones_the_patch_embedding_sees_as_zeros():
    # Patches 8 px high and 16 px wide on a 32 x 48 input: a grid of 4 rows x 3 columns (taller in patches,
    # wider per patch), so swapping the patch height and width, or the grid's, moves or crops the masks.
    torch.manual_seed(1)
    model = timm.create_model("vit_small_patch16_224", patch_size=(8, 16), img_size=(32, 48), **TINY).eval()
    layout = TokenLayout.from_model(model)
    assert layout.grid_size == (4, 3) and layout.patch_size == (8, 16)
    rng = np.random.default_rng(3)
    order, counts = rng.permutation(12), np.array([0, 1, 5, 11, 12])
    masks = pixel_masks(patch_masks(order, counts, layout.grid_size), layout, (32, 48))
    image = torch.from_numpy(rng.normal(size=(3, 32, 48)).astype(np.float32))
    with torch.no_grad():
        tokens = model.patch_embed(perturb(image, masks, "deletion"))  # (steps, 12, D) in timm's raster order
        original = model.patch_embed(image[None])[0]
    zero = model.patch_embed.proj.bias  # a patch of zeros embeds to the bias alone
    for step, count in enumerate(counts):
        deleted = np.isin(np.arange(12), order[:count])
        for token in range(12):
            want = zero if deleted[token] else original[token]
            torch.testing.assert_close(tokens[step, token], want, rtol=0, atol=1e-6)


def test_a_register_checkpoint_keeps_its_stored_grid_as_the_native_table(tmp_path):
    # The checkpoint's own grid is 7 x 7 (98 px); the model runs at 70 px (5 x 5). The page's table at 7 x 7 must
    # be the stored rows themselves, not the 5 x 5 ones resampled back.
    from safetensors.torch import save_file

    from vitviz.sources.models import ModelSpec, load_model

    torch.manual_seed(0)
    stored = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=98).eval()  # ViT-S: the
    with torch.no_grad():  # checkpoint loader builds the named architecture at its own width and depth
        stored.pos_embed.normal_()
    save_file({k: v.contiguous() for k, v in stored.state_dict().items()}, str(tmp_path / "reg4.safetensors"))
    loaded = load_model(ModelSpec(name="vit_small_patch14_reg4_dinov2", checkpoint=str(tmp_path / "reg4.safetensors"),
                                  img_size=70))
    assert loaded.layout.grid_size == (5, 5) and loaded.native_pos_embed.grid_size == (7, 7)
    np.testing.assert_array_equal(
        patch_position_embeddings(loaded.model, loaded.layout, (7, 7), native=loaded.native_pos_embed),
        stored.pos_embed[0].detach().numpy())
