"""What the user sees: exact colour maps, robust colour scales, attention sinks, click payloads, figures sent."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.figures.colour import ColourScale, colour_scale, colourise, lookup_table, reference_stops
from vitviz.analyses.distance import uniform_attention_distance
from vitviz.layout import TokenLayout
from vitviz.figures.overlay import colour_bar_ticks, render_maps, render_overlay
from vitviz.analyses.tokens import attention_sinks

LAYOUT = TokenLayout(("cls",), (16, 16), (14, 14), "token", 1)
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _rgb(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text[text.index("(") + 1:-1].split(","))


def test_inferno_reference_stops_start_at_its_true_black_not_a_theme_colour():
    stops = reference_stops("Inferno")
    assert stops[0] == [0.0, "rgb(0, 0, 4)"] and stops[-1][0] == 1.0
    lut = lookup_table("Inferno")
    assert tuple(lut[0]) == (0, 0, 4) and tuple(lut[-1]) == _rgb(stops[-1][1])
    # Lightness (sum of RGB) rises monotonically along Inferno: a swapped low stop would break it.
    assert np.all(np.diff(lut.astype(int).sum(1)) >= -1)


def test_colourise_maps_scale_ends_to_the_first_and_last_stop():
    scale = ColourScale(0.0, 2.0)
    out = colourise(np.array([[0.0, 2.0, 5.0]]), scale, "Viridis")
    stops = reference_stops("Viridis")
    assert tuple(out[0, 0]) == _rgb(stops[0][1])
    assert tuple(out[0, 1]) == tuple(out[0, 2]) == _rgb(stops[-1][1])  # 5 is clipped to the top colour


def test_robust_scale_top_is_the_99th_percentile_not_the_hot_patch():
    rng = np.random.default_rng(0)
    maps = rng.uniform(0, 0.01, size=(2, 16, 16))
    maps[0, 3, 4] = 0.5  # one hot patch, 50x the rest
    scales = colour_scale(maps, "robust per head")
    assert scales[0].hi == pytest.approx(np.percentile(maps[0], 99))
    assert scales[0].hi < 0.02 and scales[0].above(maps[0])[3, 4]
    assert colour_scale(maps, "full range per map")[0].hi == pytest.approx(0.5)
    shared = colour_scale(maps, "shared across heads")
    assert shared[0] is shared[1] and shared[0].hi == pytest.approx(np.percentile(maps, 99))


def test_query_patch_self_attention_sets_no_limit():
    maps = np.full((1, 16, 16), 0.001)
    maps[0, 0, :8] = 0.004
    maps[0, 5, 5] = 0.9  # the query attending to itself
    query = 5 * 16 + 5
    rendered = render_maps(Image.new("RGB", (224, 224)), maps, scale_mode="full range per map", query=query)
    assert rendered.scales[0].hi == pytest.approx(0.004)
    assert query in rendered.excluded and query not in rendered.clipped[0]


def test_log_scale_spans_the_positive_values_and_ticks_are_inside():
    maps = np.geomspace(1e-4, 1e-1, 256).reshape(1, 16, 16)
    scale = colour_scale(maps, "log")[0]
    assert scale.log and -4.1 < scale.lo < -3.9 and -1.1 < scale.hi < -0.9
    ticks = colour_bar_ticks(scale)
    assert len(ticks) >= 3 and all(0 <= p <= 1 for p, _ in ticks)


def test_heatmap_overlay_at_full_opacity_shows_the_colour_map_exactly():
    grid = np.zeros((16, 16))
    grid[0, 0] = 1.0
    tile = np.asarray(render_overlay(Image.new("RGB", (224, 224), "white"), grid, ColourScale(0.0, 1.0),
                                     cmap="Inferno", style="heatmap", opacity=1.0))
    assert tuple(tile[7, 7]) == tuple(lookup_table("Inferno")[-1])
    assert tuple(tile[100, 100]) == (0, 0, 4)


def test_transparent_where_low_leaves_the_image_where_the_map_is_zero():
    grid = np.zeros((16, 16))
    grid[8, 8] = 1.0
    tile = np.asarray(render_overlay(Image.new("RGB", (224, 224), (200, 100, 50)), grid, ColourScale(0.0, 1.0)))
    assert tuple(tile[5, 5]) == (200, 100, 50)
    assert tuple(tile[8 * 14 + 7, 8 * 14 + 7]) != (200, 100, 50)


def _attention_with_sink(sink_token: int, layers: int = 3, heads: int = 2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    N = LAYOUT.num_tokens
    a = rng.uniform(0.5, 1.5, size=(layers, heads, N, N))
    a[1, :, :, sink_token] += 60.0  # layer 2: every query pours attention into one token
    return a / a.sum(-1, keepdims=True)


def test_sink_detection_finds_the_planted_sink_in_its_layer_only():
    sink = LAYOUT.num_prefix_tokens + 37
    found = attention_sinks(_attention_with_sink(sink), LAYOUT)
    assert found.sinks[1].tolist() == [sink]
    assert found.sinks[0].size == 0 and found.sinks[2].size == 0
    assert found.patch_sinks(LAYOUT).tolist() == [37]
    assert found.share(1, [sink]) == pytest.approx(found.received[1, sink]) and found.share(1, [sink]) > 0.15
    np.testing.assert_allclose(found.received.sum(1), 1.0)


def test_uniform_attention_distance_is_the_papers_116_5_px_on_14x14_patch_16():
    layout = TokenLayout(("cls",), (14, 14), (16, 16), "token", 1)
    assert uniform_attention_distance(layout) == pytest.approx(116.5, abs=0.1)


def test_clicked_point_customdata_is_read_from_a_dict_or_a_list():
    from ui.charts import point_customdata

    assert point_customdata({"customdata": {"0": 7, "1": 3, "10": 9, "2": 1.5}}) == [7, 3, 1.5, 9]
    assert point_customdata({"customdata": [7, 3]}) == [7, 3]
    assert point_customdata({"x": 1}) == []


def test_file_names_say_what_the_figure_is():
    from ui.charts import file_stem

    assert file_stem("heads", "my photo.JPG", "layer12", "cls") == "heads_myphoto_layer12_cls"


# ---------------------------------------------------------------- the figures the app sends (AppTest)

def _chart(at, key):
    return next(c for c in at.get("plotly_chart") if key in (c.proto.id or ""))


def _page(page):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=240).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.message for e in at.exception]
    return at


@pytest.mark.slow
@pytest.mark.parametrize("page", ["pages/1_overview.py", "pages/2_heads.py", "pages/3_rollout.py",
                                  "pages/4_distance.py"])
def test_every_chart_is_sent_without_the_streamlit_theme_and_with_exact_stops(bundled, page):
    at = _page(page)
    charts = at.get("plotly_chart")
    assert charts
    for chart in charts:
        assert chart.proto.theme == "", f"{chart.proto.id} is drawn with the Streamlit theme, which swaps colours"
        for trace in json.loads(chart.proto.spec)["data"]:
            marker = trace.get("marker") or {}
            if marker.get("showscale"):
                name = "Inferno" if "rgb(0, 0, 4)" in str(marker["colorscale"]) else "Viridis"
                assert [[p, c] for p, c in marker["colorscale"]] == reference_stops(name)


@pytest.mark.slow
def test_heads_grid_top_colour_is_each_maps_99th_percentile(bundled):
    from vitviz.trace import trace_for_analysis as capture
    from vitviz.io.images import load_image
    from vitviz.sources.preprocess import preprocess
    from vitviz.analyses.maps import layer_maps

    at = _page("pages/2_heads.py")
    spec = json.loads(_chart(at, "heads_grid").proto.spec)
    tops = [float(a["text"].split("top ")[1].split("<")[0]) for a in spec["layout"]["annotations"] if "top " in a["text"]]
    batch = preprocess([load_image(Path(APP).parent / "assets" / "astronaut.jpg").image], bundled.data_config)
    out = capture(bundled.model, batch.tensor)
    attention, layout = out.stack("attn")[0].numpy(), out.layout
    maps = layer_maps(attention, layout, attention.shape[0] - 1, "cls")
    sinks = attention_sinks(attention, layout).patch_sinks(layout, [attention.shape[0] - 1])
    keep = np.ones(layout.num_patches, bool)
    keep[sinks] = False
    expected = [np.percentile(m.ravel()[keep], 99) for m in maps]
    assert len(tops) == len(maps)
    # Titles print 3 significant digits (:.3g): half a unit of the third digit, 0.5·10^(e-2) for a value
    # m·10^e, up to 5e-3 relative at m = 1 (rtol 2e-3 passed only for these values); plus float32's
    # percentile noise (a few u relative, far below).
    half_unit = 0.5 * 10.0 ** (np.floor(np.log10(np.abs(expected))) - 2)
    assert np.all(np.abs(np.asarray(tops) - expected) <= half_unit * (1 + 1e-6)), (tops, expected)
    assert all(t < m.max() for t, m in zip(tops, maps))


def test_dino_mask_style_keeps_the_image_inside_the_mask_dims_outside_and_clips_nothing():
    maps = np.zeros((1, 16, 16))
    maps[0, :2, :2] = 1.0
    mask = maps[0] > 0
    image = Image.new("RGB", (224, 224), (200, 200, 200))
    rendered = render_maps(image, maps, style="DINO mask", opacity=0.5, masks=mask[None])
    tile = np.asarray(rendered.tiles[0])
    assert tuple(tile[10, 10]) == (200, 200, 200) and tuple(tile[150, 150]) == (100, 100, 100)
    assert rendered.clipped[0].size == 0


def test_a_panel_without_values_in_its_colours_has_no_colour_bar():
    from vitviz.figures.core import map_panel

    maps = np.random.default_rng(1).random((2, 16, 16))
    rendered = render_maps(Image.new("RGB", (224, 224)), maps)
    kwargs = dict(cmap="Inferno", value_name="attention", columns=2)
    with_bar = map_panel(rendered.tiles, maps, rendered.scales, ["a", "b"], LAYOUT, **kwargs)
    without = map_panel(rendered.tiles, maps, rendered.scales, ["a", "b"], LAYOUT, colour_bar=False, **kwargs)
    assert sum(bool(getattr(t, "marker", None) and t.marker.showscale) for t in with_bar.data) == 1
    assert not any(getattr(t, "marker", None) and t.marker.showscale for t in without.data)


def test_sinks_are_marked_on_their_own_tile_and_none_sets_a_limit():
    # A faint gradient up to 0.01 (a constant map would be drawn flat at mid-scale, whatever its sinks).
    maps = np.tile(np.linspace(0.005, 0.009, 256).reshape(16, 16), (2, 1, 1))
    maps[:, 8, 8] = 0.01
    maps[0, 0, 0] = 5.0   # a sink of the first tile's layer
    maps[1, 15, 15] = 5.0  # a sink of the second tile's layer
    image = Image.new("RGB", (224, 224), "white")
    rendered = render_maps(image, maps, scale_mode="full range per map", sinks=[np.array([0]), np.array([255])],
                           style="heatmap", opacity=1.0)
    assert [s.hi for s in rendered.scales] == [pytest.approx(0.01)] * 2
    first, second = (np.asarray(t) for t in rendered.tiles)
    # A white cross runs through the sink's cell on its own tile only.
    assert tuple(first[7, 7]) == (255, 255, 255) and tuple(second[7, 7]) != (255, 255, 255)
    assert tuple(second[217, 217]) == (255, 255, 255) and tuple(first[217, 217]) != (255, 255, 255)


def test_signed_maps_are_drawn_diverging_around_zero_whatever_colour_map_is_asked():
    """A signed map (relevance) on the photo: its limits are ± the 99th percentile of |value|, 0 sits at the
    diverging map's centre (transparent where low: the photo itself), the positive end is red, the negative blue
    (RdBu_r), even when the page's Display asks for Inferno; clipping counts both ends."""
    rng = np.random.default_rng(0)
    grid = rng.uniform(-1.0, 1.0, (16, 16))
    grid[0, 0], grid[0, 1], grid[5, 5] = 50.0, -50.0, 0.0
    photo = Image.new("RGB", (224, 224), (90, 160, 40))
    heat = render_maps(photo, grid[None], cmap="Inferno", style="heatmap", opacity=1.0, signed=True)
    (scale,) = heat.scales
    limit = np.percentile(np.abs(grid), 99)
    assert (scale.lo, scale.hi, scale.signed, heat.cmap) == (pytest.approx(-limit), pytest.approx(limit), True, "RdBu_r")
    lut, tile = lookup_table("RdBu_r"), np.asarray(heat.tiles[0])
    assert tuple(tile[7, 7]) == tuple(lut[-1]) and tuple(tile[7, 14 + 7]) == tuple(lut[0])  # +50 red, -50 blue
    assert tuple(tile[5 * 14 + 7, 5 * 14 + 7]) == tuple(lut[128])  # 0: the centre stop (rounded up at 127.5)
    assert sorted(heat.clipped[0].tolist()) == sorted(np.flatnonzero(np.abs(grid.ravel()) > limit).tolist())
    low = np.asarray(render_maps(photo, grid[None], style="transparent where low", opacity=1.0, signed=True).tiles[0])
    assert tuple(low[5 * 14 + 7, 5 * 14 + 7]) == (90, 160, 40)  # 0 lets the photo through
    assert colour_bar_ticks(scale)[2] == (0.5, "0")  # the bar's middle tick is 0


def test_a_panel_is_shown_as_wide_as_its_tiles_at_its_height_plus_its_colour_bar():
    """Two 224 px tiles drawn 300 px high are about 600 px wide on screen (equal x/y scale); the figure's width for
    the page adds the colour bar's room only when there is a bar. Shown at full column width instead, the bar sat
    ~250 px right of the tiles (the Repair maps at 1440x900)."""
    from vitviz.figures.core import COLOUR_BAR_PX, map_panel, panel_width

    maps = np.random.default_rng(1).random((2, 16, 16))
    rendered = render_maps(Image.new("RGB", (224, 224)), maps)
    kwargs = dict(cmap="Inferno", value_name="attention", columns=2, tile_px=300)
    with_bar = map_panel(rendered.tiles, maps, rendered.scales, ["", ""], LAYOUT, **kwargs)
    without = map_panel(rendered.tiles, maps, rendered.scales, ["", ""], LAYOUT, colour_bar=False, **kwargs)
    # 2 x 300 px tiles + an 8 px gap and 4 px of range on each side, at 300 / 224 screen px per tile px: 621 px at most.
    tiles = panel_width(without)
    assert 600 <= tiles <= 600 + round(16 * 300 / 224) + 1, tiles
    assert panel_width(with_bar) == tiles + COLOUR_BAR_PX
