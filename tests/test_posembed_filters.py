"""Position-embedding resampling against the loaders, PCA sign rule, and the two figures' known answers."""
import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from vitviz.figures.core import similarity_grid, similarity_map
from vitviz.analyses.filters import fix_signs, patch_filter_pca
from vitviz.sources.models import ModelSpec, load_model
from vitviz.analyses.posembed import (NativePosEmbed, patch_position_embeddings, position_at, position_embedding_similarity,
                             position_fraction)


# ---- resampling from the native weights, as the loader does ---------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("img_size, grid", [(336, 24), (518, 37)])
def test_bundled_resampled_position_embeddings_equal_the_loader_at_that_size(bundled, img_size, grid):
    loaded = load_model(ModelSpec(img_size=img_size))
    expected = loaded.model.pos_embed[0, 1:].numpy()
    got = patch_position_embeddings(bundled.model, bundled.layout, (grid, grid), native=bundled.native_pos_embed)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # Resampling the 16x16 grid the model runs with again (the old way) is visibly different.
    assert np.abs(patch_position_embeddings(bundled.model, bundled.layout, (grid, grid)) - expected).max() > 1e-2


@pytest.mark.slow
def test_bundled_native_grid_is_the_stored_37x37_weights_and_resampled_without_antialias(bundled):
    native = bundled.native_pos_embed
    assert native.grid_size == (37, 37) and native.prefix_rows == 1
    assert (native.interpolation, native.antialias) == ("bicubic", False)
    from vitviz.sources.bundled import load_state_dict

    stored = load_state_dict()[0]["pos_embed"][0, 1:].numpy()
    got = patch_position_embeddings(bundled.model, bundled.layout, (37, 37), native=native)
    np.testing.assert_array_equal(got, stored)


def _checkpoint(tmp_path, name):
    """Random weights of ``name`` at 64 px (4x4 patches), its position embedding made distinctive."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=64)
    with torch.no_grad():
        model.pos_embed.normal_()
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


@pytest.mark.parametrize("name, prefix", [("vit_tiny_patch16_224", 1), ("deit3_small_patch16_224", 0)])
def test_checkpoint_position_embeddings_resample_like_timm_loading_it_at_that_size(tmp_path, name, prefix):
    stored, path = _checkpoint(tmp_path, name)
    at_96 = load_model(ModelSpec(name, checkpoint=str(path), img_size=96, device="cpu"))
    at_160 = load_model(ModelSpec(name, checkpoint=str(path), img_size=160, device="cpu"))
    assert at_96.native_pos_embed.grid_size == (4, 4) and at_96.layout.pos_embed_prefix_rows == prefix
    # From the model at 96 px (6x6), the 10x10 grid equals what loading the checkpoint at 160 px gives ...
    got = patch_position_embeddings(at_96.model, at_96.layout, (10, 10), native=at_96.native_pos_embed)
    np.testing.assert_allclose(got, at_160.model.pos_embed[0, prefix:].numpy(), rtol=0, atol=1e-6)
    # ... and the native 4x4 grid is the checkpoint's own rows.
    native = patch_position_embeddings(at_96.model, at_96.layout, (4, 4), native=at_96.native_pos_embed)
    np.testing.assert_array_equal(native, stored.pos_embed[0, prefix:].detach().numpy())


def test_without_native_weights_the_model_grid_is_resampled_with_timm_defaults():
    from timm.layers import resample_abs_pos_embed

    from vitviz.layout import TokenLayout

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, depth=1, embed_dim=32, num_heads=2,
                              img_size=64)
    layout = TokenLayout.from_model(model)
    expected = resample_abs_pos_embed(model.pos_embed.detach(), [7, 7], [4, 4], num_prefix_tokens=1)[0, 1:]
    np.testing.assert_allclose(patch_position_embeddings(model, layout, (7, 7)), expected.numpy(), atol=1e-7)
    np.testing.assert_array_equal(patch_position_embeddings(model, layout), model.pos_embed[0, 1:].detach().numpy())


def test_native_pos_embed_of_a_non_square_unknown_grid_is_none():
    assert NativePosEmbed.from_weights(torch.zeros(1, 1 + 12, 8), prefix_rows=1) is None
    assert NativePosEmbed.from_weights(torch.zeros(1, 1 + 16, 8), prefix_rows=1).grid_size == (4, 4)


def test_selected_position_survives_a_grid_change_as_a_fraction():
    f = position_fraction((3, 12), (16, 16))
    assert position_at(f, (16, 16)) == (3, 12)
    assert position_at(f, (32, 32)) == (7, 25)  # the centre of (3, 12) on a finer grid
    assert position_at(f, (8, 8)) == (1, 6)
    assert position_at((1.0, 1.0), (5, 7)) == (4, 6) and position_at((-0.1, 0.0), (5, 7)) == (0, 0)


# ---- filter PCA signs -----------------------------------------------------------------------

def _filters(seed=0):
    """300 filters (3, 4, 4) whose principal components are exactly ``basis`` (4, 48), in order:
    centred, uncorrelated coordinates with standard deviations 9, 5, 3, 1."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(3 * 4 * 4, 4)))
    raw = rng.normal(size=(300, 4))
    coeffs, _ = np.linalg.qr(raw - raw.mean(0))  # orthonormal, centred columns
    coeffs = coeffs * np.sqrt(300) * [9.0, 5.0, 3.0, 1.0]
    return (coeffs @ basis.T).reshape(300, 3, 4, 4), basis.T


def test_filter_pca_largest_entry_of_every_component_is_positive():
    pca = patch_filter_pca(_filters()[0], n_components=4)
    flat = pca.components.reshape(4, -1)
    largest = flat[np.arange(4), np.abs(flat).argmax(1)]
    assert np.all(largest > 0), largest


def test_filter_pca_is_identical_when_a_component_of_the_input_flips_sign():
    filters, basis = _filters()
    coeffs = filters.reshape(300, -1) @ basis.T  # (300, 4) coordinates along the true components
    flipped = (filters.reshape(300, -1) - 2 * np.outer(coeffs[:, 1], basis[1])).reshape(filters.shape)
    a, b = patch_filter_pca(filters, n_components=4), patch_filter_pca(flipped, n_components=4)
    np.testing.assert_allclose(np.abs(a.components.reshape(4, -1)), np.abs(basis), atol=1e-10)
    np.testing.assert_allclose(b.components, a.components, atol=1e-10)
    np.testing.assert_allclose(b.tiles, a.tiles, atol=1e-10)
    np.testing.assert_allclose(patch_filter_pca(-filters, n_components=4).components, a.components, atol=1e-10)


def test_filter_pca_does_not_depend_on_the_sign_rule_of_the_installed_scikit_learn(monkeypatch):
    """scikit-learn <= 1.4 signed components by the left singular vectors, later versions by the right:
    simulate the other rule by flipping components 1 and 3 as fit returns them."""
    from sklearn.decomposition import PCA

    filters = _filters()[0]
    expected = patch_filter_pca(filters, n_components=4)
    fit = PCA.fit

    def fit_with_other_signs(self, X, y=None):
        fit(self, X, y)
        self.components_ = self.components_ * np.array([1, -1, 1, -1])[:, None]
        return self

    monkeypatch.setattr(PCA, "fit", fit_with_other_signs)
    got = patch_filter_pca(filters, n_components=4)
    np.testing.assert_array_equal(got.components, expected.components)
    np.testing.assert_array_equal(got.tiles, expected.tiles)


def test_fix_signs_flips_exactly_the_components_whose_largest_entry_is_negative():
    components = np.array([[0.1, -0.9, 0.2], [0.5, 0.1, -0.3], [-0.2, 0.2, 0.0]])
    np.testing.assert_array_equal(fix_signs(components), [[-0.1, 0.9, -0.2], [0.5, 0.1, -0.3], [0.2, -0.2, 0.0]])
    np.testing.assert_array_equal(fix_signs(-components), fix_signs(components))


# ---- figures --------------------------------------------------------------------------------

def _known_similarity():
    """A 2x3 grid whose map of position (r, c) is r * 0.5 - c * 0.25 everywhere."""
    r, c = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    return np.broadcast_to((r * 0.5 - c * 0.25)[:, :, None, None], (2, 3, 2, 3)).copy()


def test_similarity_grid_markers_carry_0_based_positions_and_1_based_labels():
    fig = similarity_grid(_known_similarity(), (1, 2))
    scatter = next(t for t in fig.data if t.type == "scatter")
    custom = np.asarray(scatter.customdata)
    np.testing.assert_array_equal(custom[:, :2], [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]])
    np.testing.assert_array_equal(custom[:, 2:4], custom[:, :2] + 1)
    assert list(fig.layout.xaxis.ticktext) == ["1", "2", "3"] and list(fig.layout.yaxis.ticktext) == ["1", "2"]
    assert (scatter.marker.cmin, scatter.marker.cmax) == (-1, 1)
    assert scatter.marker.colorbar.title.text == "cosine similarity"
    assert "1-based" in fig.layout.xaxis.title.text and "1-based" in fig.layout.yaxis.title.text


def test_similarity_grid_image_has_white_gaps_and_exact_rdbu_colours():
    import base64
    import io

    from PIL import Image

    from vitviz.figures.colour import lookup_table

    sim = _known_similarity()
    fig = similarity_grid(sim, image_px=60)  # 2x3 tiles; cell = round(60 / 9) = 7 px
    png = base64.b64decode(fig.data[0].source.split(",", 1)[1])
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    cell, tw, th = 7, 21, 14
    gap = max(2, round(0.12 * tw))
    assert image.shape == (2 * th + gap, 3 * tw + 2 * gap, 3)
    lut = lookup_table("RdBu_r")
    for r in range(2):
        for c in range(3):
            y, x = r * (th + gap) + 1, c * (tw + gap) + 1
            expected = lut[int(np.round((sim[r, c, 0, 0] + 1) * 127.5))]
            np.testing.assert_array_equal(image[y, x], expected, err_msg=f"tile {r},{c}")
    assert (image[th:th + gap] == 255).all() and (image[:, tw:tw + gap] == 255).all()
    assert tuple(lut[0]) != tuple(lut[255])


def test_similarity_map_is_titled_1_based_and_fixed_minus_one_to_one():
    grid_map = np.linspace(-1, 1, 12).reshape(3, 4)
    fig = similarity_map(grid_map, (2, 0))
    heat = fig.data[0]
    assert fig.layout.title.text == "position (row 3, col 1)"
    assert (heat.zmin, heat.zmax) == (-1, 1) and heat.colorbar.title.text == "cosine similarity"
    assert list(heat.x) == [1, 2, 3, 4] and list(heat.y) == [1, 2, 3]
    np.testing.assert_allclose(heat.z, grid_map, atol=1e-7)
    box = fig.layout.shapes[0]
    assert (box.x0, box.x1, box.y0, box.y1) == (0.5, 1.5, 2.5, 3.5)


def test_position_similarity_of_a_resampled_grid_is_the_cosine_of_every_pair_of_positions():
    native = NativePosEmbed.from_weights(torch.randn(1, 1 + 25, 16, generator=torch.Generator().manual_seed(0)),
                                         prefix_rows=1)
    rows = native.grid_rows((3, 5)).numpy().astype(np.float64)  # non-square: a transposed map shows
    sim = position_embedding_similarity(rows, (3, 5))
    assert sim.shape == (3, 5, 3, 5)
    # numpy by hand: sim[i, j, k, l] = cos(e[i*5 + j], e[k*5 + l]); the diagonal alone (all ones) is also
    # what a matrix of ones, or of the wrong pairs, would give.
    for i, j, k, l in np.ndindex(3, 5, 3, 5):
        a, b = rows[i * 5 + j], rows[k * 5 + l]
        assert sim[i, j, k, l] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-12)
    np.testing.assert_allclose(np.diagonal(sim.reshape(15, 15)), 1.0, atol=1e-12)
    assert sim.min() < 0.5  # random rows: the off-diagonal entries are not all ones


def test_labelled_tiles_are_enlarged_without_smoothing_and_labels_get_room():
    from vitviz.figures.core import labelled_tile_image

    tiles = np.zeros((3, 2, 2, 3))
    tiles[1, 0, 0] = 1.0  # tile 2: top-left weight white, the rest black
    image = np.asarray(labelled_tile_image(tiles, ["PC1 · 50.0%", "PC2 · 30.0%", "PC3 · 20.0%"], "t",
                                           columns=3, tile_px=20, gap=10))
    top = 15 + 18  # below the title: font size + 18 px
    dark = np.flatnonzero(np.all(image[top + 15] == 0, axis=1))  # a pixel row through the tiles' lower half
    runs = np.split(dark, np.flatnonzero(np.diff(dark) > 1) + 1)
    assert [len(r) for r in runs] == [20, 20, 20]
    assert all(b[0] - a[-1] - 1 >= 40 for a, b in zip(runs, runs[1:]))  # the labels, not the tiles, set the pitch
    x2 = runs[1][0]
    assert np.all(image[top:top + 10, x2:x2 + 10] == 255) and np.all(image[top:top + 10, x2 + 10:x2 + 20] == 0)
    assert np.all(image[top - 1, x2:x2 + 20] == 255) and np.all(image[top + 20, x2:x2 + 20] == 255)


def test_filter_tile_figure_draws_tiles_one_to_one_with_every_label_inside_the_chart():
    """The Embedding filters page's figure (tile_grid_figure): the tiles one image shown at its own size (the figure's
    width and height are the image's plus the margins: the browser does not rescale it, so nothing blurs), every
    weight a whole square block, and every label, the last row's too, inside the axes (Plotly drops text points
    outside the range: the last row once lost its labels) and under its own tile."""
    import base64
    import io

    from PIL import Image

    from vitviz.figures.core import tile_grid_figure

    tiles = np.zeros((9, 2, 2, 3))
    tiles[:, 0, 0] = 1.0  # each tile's top-left weight white
    labels = [f"PC{i + 1} · 1.0%" for i in range(9)]
    fig = tile_grid_figure(tiles, labels, "First 9 components", columns=7, tile_px=21)
    layout = fig.layout
    canvas = Image.open(io.BytesIO(base64.b64decode(fig.data[0].source.split(",", 1)[1])))
    assert layout.width == canvas.width + layout.margin.l + layout.margin.r
    assert layout.height == canvas.height + layout.margin.t + layout.margin.b
    assert layout.meta["pixels_per_weight"] == 10 and layout.meta["tile_px"] == [20, 20]  # round(21 / 2) = 10
    pixels = np.asarray(canvas)
    assert np.all(pixels[0:10, 0:10] == 255) and np.all(pixels[0:10, 10:20] == 0)  # a 10 x 10 block per weight
    text = fig.data[1]
    y_lo, y_hi = sorted(layout.yaxis.range)
    assert list(text.text) == labels and all(y_lo <= y <= y_hi for y in text.y)
    assert text.y[7] > 20 and text.x[7] == text.x[0]  # the 8th label: second row, first column
    assert layout.title.text == "First 9 components" and layout.margin.t >= 30  # room for the title: not clipped


def test_the_position_page_offers_grids_up_to_twice_the_models_or_the_stored_one_capped():
    from vitviz.analyses.posembed import grid_with_rows, resampled_rows

    assert resampled_rows(16, None, 40) == 32  # the bundled model: twice its 16 rows
    assert resampled_rows(16, 37, 40) == 37  # a stored 37-row table (DINOv2 at 518 px) run at 224 px
    assert resampled_rows(24, None, 40) == 40  # capped at what stays legible
    assert resampled_rows(48, None, 40) == 48  # never below the model's own grid
    assert grid_with_rows(20, (16, 16)) == (20, 20)
    assert grid_with_rows(21, (12, 20)) == (21, 35)  # 12 x 20 keeps its 3 : 5 aspect
    assert grid_with_rows(5, (3, 4)) == (5, 6)  # 6.67 columns: rounded down


def test_filter_tiles_draw_every_weight_as_the_same_whole_number_of_pixels():
    from vitviz.figures.core import whole_pixel_tile

    assert whole_pixel_tile(14, 168) == 168  # 12 px per weight of a 14-pixel filter
    assert whole_pixel_tile(16, 168) == 160  # 10 px per weight, not 10.5
    assert whole_pixel_tile(14, 112) == 112 and whole_pixel_tile(16, 112) == 112
    assert whole_pixel_tile(200, 112) == 200  # at least one pixel per weight
