"""The browser explorer's payload (vitviz/figures/explorer.py) and the flat-map floor of the colour scales."""
import io

import numpy as np
import torch
from PIL import Image

from conftest import tiny_model
from vitviz.trace import trace_for_analysis as capture
from vitviz.figures.colour import FLAT_RELATIVE, colour_scale, colourise, lookup_table
from vitviz.figures.explorer import FLOAT16_ABSOLUTE, FLOAT16_RELATIVE, explorer_payload, rollout_payload, unpack
from vitviz.analyses.maps import key_attention_map, query_attention_map
from vitviz.figures.overlay import render_maps


def _attention(family="dinov2_reg"):
    model = tiny_model(family)
    size = model.patch_embed.img_size
    torch.manual_seed(1)
    out = capture(model, torch.randn(1, 3, *size))
    return out.stack("attn")[0].numpy(), out.layout


def _close_as_float16(got, want):
    """float16 keeps 11 significant bits: |got - want| <= 2^-11 |want|, or 2^-25 below float16's normal range."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.abs(got - want) <= np.maximum(FLOAT16_RELATIVE * np.abs(want), FLOAT16_ABSOLUTE)), \
        np.abs(got - want).max()


def test_payload_rows_are_the_attention_maps_in_float16():
    attention, layout = _attention()  # CLS + 4 registers: a wrong prefix offset reads register columns
    L, H = attention.shape[:2]
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (70, 70, 3), dtype=np.uint8))
    payload = explorer_payload(attention, layout, image, sinks=[np.zeros(0, int)] * L)
    header, arrays = unpack(payload.data)
    assert payload.patch_rows and header["grid"] == list(layout.grid_size) and header["layers"] == L
    for layer in (0, L - 1):
        for head in range(H):
            _close_as_float16(arrays["cls"][layer, head], query_attention_map(attention, layout, layer, head, "cls").ravel())
            _close_as_float16(arrays["mean"][layer, head], query_attention_map(attention, layout, layer, head, "mean").ravel())
            _close_as_float16(arrays["rows"][layer, head, 7], query_attention_map(attention, layout, layer, head, 7).ravel())
            _close_as_float16(arrays["rows"][layer, head, :, 7], key_attention_map(attention, layout, layer, head, 7).ravel())
    decoded = np.asarray(Image.open(io.BytesIO(arrays["image"].tobytes())))
    np.testing.assert_array_equal(decoded, np.asarray(image))  # PNG: the exact pixels the tiles blend with


def test_payload_over_budget_sends_the_selected_patch_only():
    attention, layout = _attention()
    L, H = attention.shape[:2]
    image = Image.new("RGB", (70, 70))
    payload = explorer_payload(attention, layout, image, sinks=[np.zeros(0, int)] * L, selected=11, patch_rows_budget=0)
    header, arrays = unpack(payload.data)
    assert not payload.patch_rows and "rows" not in arrays and header["selected"] == 11
    _close_as_float16(arrays["row"][1, 2], query_attention_map(attention, layout, 1, 2, 11).ravel())
    _close_as_float16(arrays["col"][1, 2], key_attention_map(attention, layout, 1, 2, 11).ravel())
    # Same attention, same bytes, same name: the browser keeps its view across reruns.
    again = explorer_payload(attention, layout, image, sinks=[np.zeros(0, int)] * L, selected=11, patch_rows_budget=0)
    assert again.digest == payload.digest and again.data == payload.data


def test_a_near_uniform_map_is_drawn_flat_at_mid_scale_not_stretched():
    rng = np.random.default_rng(0)
    uniform = np.full((4, 4), 1 / 17) + rng.normal(0, 1e-9, (4, 4))  # a random head's attention: ripples of 1e-9
    real = np.full((4, 4), 0.01)
    real[1, 2] = 0.5
    flat_scale, real_scale = colour_scale(np.stack([uniform, real]), "robust per head")
    assert flat_scale.flat and not real_scale.flat
    # Without the floor the 99th percentile sits at the ripples' top and half the map is drawn in the top colour.
    colours = colourise(uniform, flat_scale, "Inferno").reshape(-1, 3).astype(int)
    middle = lookup_table("Inferno")[127:129].astype(int)  # t = 0.5 lies between steps 127 and 128 of 255
    assert all((c == middle).all(axis=1).any() for c in colours)
    assert not colour_scale(np.stack([real]), "full range per map")[0].flat
    spread = np.full((4, 4), 0.1)
    spread[0, 0] *= 1 + 3 * FLAT_RELATIVE  # above the floor: a real, if faint, pattern keeps its stretched scale
    assert not colour_scale(spread[None], "robust per head")[0].flat
    rendered = render_maps(Image.new("RGB", (8, 8)), np.stack([real, uniform]), scale_mode="robust per head")
    assert "1 map flat" in rendered.caption()


def test_png_titles_have_the_glyphs_they_use():
    """Pillow's built-in font draws –, × and → as the same box as an unassigned code point."""
    from vitviz.figures.overlay import _font

    font = _font(18)
    missing = bytes(font.getmask("\U0010ffff"))
    for glyph in "–×→":
        assert bytes(font.getmask(glyph)) != missing, glyph


def test_the_heads_png_keeps_each_tiles_subtitle():
    from vitviz.figures.colour import ColourScale
    from vitviz.figures.overlay import colour_bar, panel_png

    tiles = [Image.new("RGB", (40, 40), "grey")] * 2
    bar = colour_bar(ColourScale(0, 1), "Inferno", "attention weight", 60)
    plain = panel_png(tiles, ["head 1", "head 2"], "Layer 1", bar, columns=2)
    noted = panel_png(tiles, ["head 1", "head 2"], "Layer 1", bar, columns=2, notes=["H 3.61 nats", "H 3.47 nats"])
    assert noted.height > plain.height
    # The note's line (between the title line and the tile) has ink under the first tile.
    row = np.asarray(noted)[18 + 16 + 18 + 4: 18 + 16 + 18 + 4 + 12, 10:50]
    assert (row < 128).any()


def test_rollout_payload_rows_are_each_patchs_rollout_in_float16():
    """The rollout view's rows: the readout's chain and every patch query's, after each layer of a range, against
    the definition (full N x N products, rollout_reference) for a few patches, rounded once to float16."""
    from vitviz.analyses.rollout import rollout_reference

    attention, layout = _attention()  # CLS + 4 registers: a wrong prefix offset reads register rows
    attention = np.concatenate([attention, attention[::-1], attention])  # 6 layers whose products do not commute
    image = Image.new("RGB", (70, 70))
    exclude = (layout.num_prefix_tokens + 3,)  # a patch kept out of the rollout: its column zeroed in every layer
    payload = rollout_payload(attention, layout, image, fusion="max", start=1, end=5, exclude_tokens=exclude,
                              sinks=np.array([3]))
    header, arrays = unpack(payload.data)
    assert payload.patch_rows and header["view"] == "rollout" and (header["start"], header["end"]) == (2, 5)
    D = 4
    want = rollout_reference(attention, layout, fusion="max", start=1, end=5, exclude_tokens=exclude)
    _close_as_float16(arrays["readout"], want.per_layer.reshape(D, -1))
    for q in (0, 7, layout.num_patches - 1):
        want = rollout_reference(attention, layout, fusion="max", start=1, end=5, exclude_tokens=exclude, query=q)
        _close_as_float16(arrays["rows"][:, q], want.per_layer.reshape(D, -1))
    others = np.delete(arrays["rows"][:, :, 3], 3, axis=1)  # only patch 3's own row keeps mass on itself (+0.5 I)
    assert np.all(others == 0) and np.all(arrays["rows"][:, 3, 3] > 0)


def test_rollout_payload_with_discard_sends_the_clicked_patchs_own_chain():
    """With discard each query spares its own column, so the shared product would be wrong: only the clicked patch's
    chain is sent, computed for it."""
    from vitviz.analyses.rollout import rollout_reference

    attention, layout = _attention()
    L = attention.shape[0]
    payload = rollout_payload(attention, layout, Image.new("RGB", (70, 70)), discard=0.5, selected=5)
    header, arrays = unpack(payload.data)
    assert not payload.patch_rows and "rows" not in arrays and header["selected"] == 5
    want = rollout_reference(attention, layout, discard=0.5, query=5)
    _close_as_float16(arrays["row"], want.per_layer.reshape(L, -1))
    _close_as_float16(arrays["readout"], rollout_reference(attention, layout, discard=0.5).per_layer.reshape(L, -1))


def test_head_notes_name_each_heads_entropy_focus_and_distance():
    from vitviz.analyses.maps import head_notes

    # Asymmetric in layer and head: a swapped index or a wrong score in a slot reads another tile's numbers.
    scores = {"entropy": np.array([[1.234, 2.0], [3.5, 0.004]]), "cls_focus": np.array([[0.1, 0.25], [0.5, 0.987]])}
    distance = np.array([[10.4, 20.6], [30.0, 99.5]])
    notes = head_notes(scores, distance)
    assert notes.shape == (2, 2)
    assert notes.tolist() == [["H 1.23 nats · focus 0.10 · 10 px", "H 2.00 nats · focus 0.25 · 21 px"],
                              ["H 3.50 nats · focus 0.50 · 30 px", "H 0.00 nats · focus 0.99 · 100 px"]]


def test_heads_tile_notes_agree_on_the_server_grid_and_in_the_browser(bundled, sample_images):
    from types import SimpleNamespace

    from ui.display import Display
    from ui.explorer import heads_payload
    from ui.heads import HeadsView, heads_panel
    from vitviz.analyses.per_image import analyse_images

    r = analyse_images(bundled, [sample_images[0].image]).image(0)
    ctx = SimpleNamespace(result=r, padding=np.zeros(0, int))
    header, _ = unpack(heads_payload(ctx, None).data)
    L, H = r.attention.shape[:2]
    for layer in (0, L - 1):
        # Ranked by entropy: the server's tiles come in another order than the browser's (L, H) table.
        panel = heads_panel(ctx, HeadsView(layer, "cls", "query", 0.0, "entropy (low = focused)", Display()))
        assert sorted(panel.order) == list(range(H)) and panel.order != list(range(H))
        assert panel.notes == [header["notes"][layer][h] for h in panel.order]
        # The entropy in a note is the patch queries' mean entropy over patch keys, computed here in numpy.
        h = panel.order[0]
        rows = np.asarray(r.attention[layer, h], np.float64)[r.layout.patch_slice, r.layout.patch_slice]
        p = rows / rows.sum(axis=1, keepdims=True)
        entropy = float(-(p * np.log(np.where(p > 0, p, 1))).sum(axis=1).mean())
        assert panel.notes[0].startswith(f"H {entropy:.2f} nats · focus "), (panel.notes[0], entropy)

