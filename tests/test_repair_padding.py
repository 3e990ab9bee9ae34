"""Issue 34 (walk3): the Repair maps (before / after, ui/repair.py via vitviz.figures.registers_figures.maps_figure)
hatch the padding patches of a padded photo and keep them out of their shared colour scale, as every Display page
does, and stop when the Display switch says so. Read from the figure the page sends: the colour bar's top and the
panel's pixels (the hatch is a light-grey line along each padding patch's anti-diagonal)."""
import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import ASSETS

APP = str(Path(__file__).resolve().parent.parent / "app.py")
# A hatched patch's anti-diagonal is a 1 px line of the hatch colour: after the panel's JPEG its pixels are closer to
# that colour than the main diagonal's pixels are, by about the distance of the patch's own colour from it. Measured
# on chelsea.jpg padded: 142-157 on the padding band, at most 35 on the photo's patches (their content), 1 on an
# unhatched band; 80 is halfway.
HATCH_MIN_CONTRAST = 80


def _panel(spec: dict) -> tuple[np.ndarray, list[tuple[float, float]], float]:
    """The figure's one image (h, w, 3), each tile's top-left corner in it, and the colour bar's top."""
    source = next(t for t in spec["data"] if t["type"] == "image")["source"]
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).convert("RGB"), dtype=float)
    corners = [(t["x0"] - t["dx"] / 2, t["y0"] - t["dy"] / 2) for t in spec["data"] if t["type"] == "heatmap"]
    bar = next(t for t in spec["data"] if t["type"] == "scatter" and t.get("marker", {}).get("colorbar"))
    return pixels, corners, float(bar["marker"]["cmax"])


def _hatch_contrast(pixels: np.ndarray, corner: tuple[float, float], grid: tuple[int, int],
                    patch_px: int) -> np.ndarray:
    """(gh * gw,) how much closer to the hatch colour each patch's anti-diagonal is than its main diagonal (mean RGB
    distance, 0-255 levels): large where hatched, about 0 elsewhere (a patch's content has no preferred diagonal)."""
    from vitviz.figures.overlay import PADDING_COLOUR

    ox, oy = int(corner[0]), int(corner[1])
    steps = np.arange(patch_px)
    far = lambda px: np.linalg.norm(px - np.array(PADDING_COLOUR, dtype=float), axis=-1).mean()  # noqa: E731
    out = []
    for p in range(grid[0] * grid[1]):
        r, c = divmod(p, grid[1])
        x0, y0 = ox + c * patch_px, oy + r * patch_px
        out.append(far(pixels[y0 + steps, x0 + steps]) - far(pixels[y0 + patch_px - 1 - steps, x0 + steps]))
    return np.array(out)


def test_maps_figure_hatches_padding_and_leaves_it_out_of_the_shared_scale():
    from vitviz.figures.colour import colour_scale
    from vitviz.figures.registers_figures import maps_figure
    from vitviz.layout import TokenLayout

    layout = TokenLayout(("cls",), (4, 4), (14, 14), "token", 1)
    rng = np.random.default_rng(0)
    maps = rng.uniform(0.0, 0.1, size=(2, 4, 4))
    # The top row is padding: the hottest in "before" (it would set the shared top colour), nothing in "after" (there
    # the hatch is drawn on the bare grey band: on the top colour a light-grey line hardly shows, by any measure).
    maps[0, 0, :], maps[1, 0, :] = 1.0, 0.0
    padding = np.arange(4)
    image = Image.new("RGB", (56, 56), (124, 116, 104))
    fig, caption = maps_figure(image, maps, ["before", "after"], layout, "t", value_name="attention", columns=2,
                               tile_px=56, padding=padding)
    pixels, corners, top = _panel(json.loads(fig.to_json()))
    exclude = np.zeros((4, 4), bool)
    exclude[0] = True
    # float64 maps: the figure's top is colour_scale's number carried through JSON (repr round-trips exactly)
    assert top == pytest.approx(colour_scale(maps, "shared across heads", exclude=exclude)[0].hi, rel=1e-12)
    assert top < 0.1  # the padding's 1.0 set no limit
    assert "4 padding patches (hatched, no photo in them) set no limit" in caption
    contrast = _hatch_contrast(pixels, corners[1], (4, 4), 14)
    assert contrast[padding].min() > HATCH_MIN_CONTRAST, contrast
    assert np.abs(contrast[4:]).max() < HATCH_MIN_CONTRAST, contrast


@pytest.mark.slow
def test_repair_maps_hatch_padding_and_keep_it_out_of_their_scale_as_the_display_switch_says():
    """chelsea.jpg (451 x 300) padded to a square on the Rollout page with sink masking: the before / after maps
    hatch the 64 padding patches and their colour bar's top is the 99th percentile without them (and without the
    sinks); with the Display switch off, no hatch and the padding counts in the scale."""
    from streamlit.testing.v1 import AppTest

    from vitviz.figures.colour import colour_scale
    from vitviz.io.images import frame_image, load_image, mean_colour
    from vitviz.analyses.per_image import analyse_images as forward
    from vitviz.sources.models import ModelSpec, load_model
    from vitviz.sources.preprocess import padding_patches

    loaded = load_model(ModelSpec())
    layout, grid = loaded.layout, tuple(loaded.layout.grid_size)
    padded = frame_image(load_image(ASSETS / "chelsea.jpg"), "pad", mean_colour(loaded.data_config))
    padding = np.flatnonzero(padding_patches(padded, loaded.data_config, grid))
    sinks = forward(loaded, [padded.image]).image(0).sinks.patch_sinks(layout)
    assert len(padding) == 64 and not set(padding.tolist()) & set(sinks.tolist())

    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["intro"] = "0"
    at.run()
    at.sidebar.multiselect(key="samples").set_value(["chelsea.jpg"]).run()
    at.sidebar.radio(key="framing").set_value("pad").run()
    at.switch_page("pages/3_rollout.py").run()
    at.toggle(key="rollout_exclude_padding").set_value(False).run()  # the padding draws rollout mass: a scale to move
    at.selectbox(key="repair_choice").set_value("sinks").run()
    assert not at.exception, [e.message for e in at.exception]

    def figure():
        chart = next(c for c in at.get("plotly_chart") if "rollout_repair_maps" in (c.proto.id or ""))
        spec = json.loads(chart.proto.spec)
        maps = np.stack([np.frombuffer(base64.b64decode(t["z"]["bdata"]), dtype=t["z"]["dtype"]).reshape(grid)
                         for t in spec["data"] if t["type"] == "heatmap"])
        return maps, *_panel(spec)

    # The hover heatmaps carry the maps in float32 (the figure's JSON), the bar's top was taken from float64: they
    # agree to float32's relative spacing (1.2e-7) times the few values the percentile interpolates between.
    def top_without(excluded) -> float:
        mask = np.zeros(grid[0] * grid[1], bool)
        mask[np.asarray(excluded, dtype=int)] = True
        return colour_scale(maps, "shared across heads", exclude=mask.reshape(grid))[0].hi

    maps, pixels, corners, top = figure()
    assert len(corners) == 2  # before | after
    assert top == pytest.approx(top_without(np.r_[sinks, padding]), rel=1e-6)
    assert top != pytest.approx(top_without(sinks), rel=1e-3)  # the padding would move the scale
    photo = np.setdiff1d(np.arange(grid[0] * grid[1]), np.r_[sinks, padding])
    for corner in corners:
        contrast = _hatch_contrast(pixels, corner, grid, layout.patch_size[0])
        assert contrast[padding].min() > HATCH_MIN_CONTRAST
        assert np.abs(contrast[photo]).max() < HATCH_MIN_CONTRAST
    assert any("64 padding patches (hatched, no photo in them) set no limit" in c.value for c in at.caption)

    at.toggle(key="exclude_padding").set_value(False).run()  # Display: padding not marked, counted in the scale
    assert not at.exception, [e.message for e in at.exception]
    maps, pixels, corners, top = figure()
    assert top == pytest.approx(top_without(sinks), rel=1e-6)
    for corner in corners:
        assert np.abs(_hatch_contrast(pixels, corner, grid, layout.patch_size[0])[padding]).max() < HATCH_MIN_CONTRAST


def test_the_attribution_pages_maps_hatch_padding_and_leave_it_out_of_their_limits():
    """The Attribution page's own maps (vitviz.figures.attribution_figures.maps_figure, the figure above its Repair
    maps) hatch the padding patches and keep them out of each map's limits: signed relevance (symmetric limits from
    |value|) and LeGrad (from 0), the padding row the hottest of each (walk4 saw LeGrad and Grad-CAM tint the bands)."""
    from attribution_names import Attribution
    from vitviz.figures.attribution_figures import maps_figure
    rng = np.random.default_rng(1)
    signed = rng.uniform(-0.1, 0.1, size=(1, 4, 4))
    signed[0, 0, :] = [-3.0, 2.0, -2.5, 3.0]  # the padding row: largest |value|
    legrad = rng.uniform(0.0, 0.1, size=(1, 4, 4))
    legrad[0, 0, :] = 1.0
    results = [Attribution("attnlrp", signed, None, np.zeros(1), None), Attribution("legrad", legrad, None, np.zeros(1),
                                                                                   None)]
    image = Image.new("RGB", (56, 56), (124, 116, 104))
    exclude = np.zeros((1, 4, 4), bool)
    exclude[0, 0] = True
    spec = json.loads(maps_figure(image, results, pixels=False, with_input=False, padding=np.arange(4)).to_json())
    heatmaps = [t for t in spec["data"] if t["type"] == "heatmap"]
    tops = [h["zmax"] for h in heatmaps]
    # the paper's limits, in numpy: the 99th percentile of |relevance| (signed) or of the values, over photo patches
    photo = ~exclude[0]
    # float64 relevance through Plotly's JSON: the same percentile arithmetic, <= 2 EPS64 apart
    assert tops[0] == pytest.approx(np.percentile(np.abs(signed[0][photo]), 99), rel=1e-9)
    assert heatmaps[0]["zmin"] == pytest.approx(-tops[0], rel=1e-9)
    assert tops[1] == pytest.approx(np.percentile(legrad[0][photo], 99), rel=1e-9)
    assert max(tops) < 0.1 + 1e-12  # neither padding row set a limit
    assert "4 padding patches (no photo in them) hatched, set no limit" in json.dumps(spec["layout"]["title"])
    for tile in [t for t in spec["data"] if t["type"] == "image"]:
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(tile["source"].split(",", 1)[1]))).convert("RGB"),
                            dtype=float)
        patch_px = pixels.shape[0] // 4
        contrast = _hatch_contrast(pixels, (0, 0), (4, 4), patch_px)
        # Lossless tiles of one-colour patches: an unhatched patch's two diagonals are the same pixels' colour
        # (contrast 0 exactly); a hatched one's anti-diagonal is the hatch line (on the clipped end colours here
        # 62 levels closer to the hatch colour than the main diagonal: a line over the patch, not a tint)
        assert contrast[:4].min() > 30, contrast
        assert np.abs(contrast[4:]).max() < 1e-9, contrast
