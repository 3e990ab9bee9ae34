"""Multi-panel figures for papers (vitviz/figures/paper_figure.py): every tile of a group is coloured on the group's
one scale (read back from the tiles' pixels and from the figure's colour bars), the scale is stated, and the SVG and
PDF hold the title, row labels and colour-bar ticks as text."""
import io
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from PIL import Image

from vitviz.figures.colour import lookup_table
from vitviz.figures.paper_figure import MapGroup, MapRow, paper_figure

TITLE = "coffee.jpg: CLS attention of every head, layers 1 and 2"
IMAGE = Image.new("RGB", (32, 32), (90, 160, 40))


def _layers():
    """Two layers of 3 heads on a 4 x 4 grid; layer 2's values are 10x layer 1's, so a scale per row would colour
    layer 1 like layer 2 and the group's shared scale cannot."""
    rng = np.random.default_rng(0)
    low = rng.uniform(0.0, 0.1, (3, 4, 4))
    return [MapRow("layer 1", low, ["head 1", "head 2", "head 3"]),
            MapRow("layer 2", 10 * low[::-1], ["head 1", "head 2", "head 3"])]


def _figure(**kwargs):
    return paper_figure(IMAGE, [MapGroup("layers 1 and 2", _layers(), "attention weight")], title=TITLE,
                        style="heatmap", opacity=1.0, **kwargs)


def test_one_group_is_one_scale_its_tiles_and_its_colour_bar_agree():
    fig = _figure()
    rows = _layers()
    values = np.concatenate([r.maps for r in rows])  # (6, 4, 4)
    top = np.percentile(values, 99)  # numpy, not the code under test: "0 to the 99th percentile of all maps"
    (scale,) = fig.scales
    # float64 maps; numpy's percentile on both sides (same sort, same interpolation): <= 2 EPS64 apart,
    # a wrong percentile >= 1e-3
    assert scale.lo == 0 and scale.hi == pytest.approx(top, rel=1e-12)
    (bar,) = fig.bars
    assert (bar.mappable.norm.vmin, bar.mappable.norm.vmax) == (scale.lo, scale.hi)  # the bar spans the tiles' scale
    # Every tile's colour (heatmap at opacity 1: the colour itself) is the lookup of its value on that one scale:
    # patch (0, 0) of layer 1's head 1 is at a tenth of layer 2's range, and a per-row scale would stretch it.
    lut = lookup_table("Inferno")
    for tile_index, v in [(0, values[0, 0, 0]), (4, values[4, 1, 2])]:
        tile = np.asarray(fig.rendered[0].tiles[tile_index])  # 32 x 32 px, 8 px per patch
        r, c = (0, 0) if tile_index == 0 else (1, 2)
        expected = lut[int(np.round(min(v / top, 1.0) * 255))]
        np.testing.assert_array_equal(tile[r * 8 + 4, c * 8 + 4], expected)
    assert "layers 1 and 2: one colour scale for its 6 maps, 0 to " in fig.scale_note()


def test_groups_have_a_scale_each_and_say_so():
    rows = _layers()
    fig = paper_figure(IMAGE, [MapGroup(r.label, [r], "attention weight") for r in rows], title=TITLE)
    limits = [(b.mappable.norm.vmin, b.mappable.norm.vmax) for b in fig.bars]
    # float64 maps, the same percentile arithmetic on both sides: <= 2 EPS64 apart
    np.testing.assert_allclose([hi for _, hi in limits],
                               [np.percentile(r.maps, 99) for r in rows], rtol=1e-12)
    assert "layer 1: one colour scale for its 3 maps" in fig.scale_note()
    assert "layer 2: one colour scale for its 3 maps" in fig.scale_note()


def test_signed_methods_side_by_side_share_one_symmetric_scale():
    rng = np.random.default_rng(1)
    relevance = rng.normal(size=(2, 4, 4))
    fig = paper_figure(IMAGE, [MapGroup("AttnLRP and CP-LRP", [MapRow("", relevance, ["AttnLRP", "CP-LRP"])],
                                        "relevance", signed=True),
                               MapGroup("LeGrad", [MapRow("", rng.random((1, 4, 4)), ["LeGrad"])], "0–1")],
                       title="attribution", arrange="across")
    signed, plain = fig.bars
    limit = np.percentile(np.abs(relevance), 99)
    # float64 relevance, the same percentile arithmetic: <= 2 EPS64 apart
    assert (signed.mappable.norm.vmin, signed.mappable.norm.vmax) == pytest.approx((-limit, limit), rel=1e-12)
    assert plain.mappable.norm.vmin == 0
    with pytest.raises(ValueError, match="same number of rows"):
        paper_figure(IMAGE, [MapGroup("a", _layers(), "v"), MapGroup("b", _layers()[:1], "v")], title="t",
                     arrange="across")


def _svg_texts(data: bytes) -> list[str]:
    root = ET.fromstring(data)
    return ["".join(t.itertext()).strip() for t in root.iter() if t.tag.endswith("text")]


def test_the_svg_and_pdf_hold_title_labels_and_ticks_as_text():
    fig = _figure()
    top_tick = f"{fig.scales[0].hi:.3g}"
    texts = _svg_texts(fig.file("svg"))
    assert TITLE in texts and "layer 1" in texts and "layer 2" in texts and "head 3" in texts
    assert top_tick in texts and "0" in texts  # the colour bar's ends
    assert any(t.startswith("layers 1 and 2: one colour scale") for t in texts)

    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(fig.file("pdf")))
    text = reader.pages[0].extract_text()
    assert TITLE in text and "layer 2" in text and top_tick in text, text
    png = Image.open(io.BytesIO(fig.file("png")))
    assert png.width > 1000  # 200 dpi


def _attention(layers=3, heads=2, grid=(3, 3), seed=0):
    """(L, H, N, N) softmax rows over CLS + a 3 x 3 grid, and its layout (patch 8 px: a 24 x 24 image)."""
    from vitviz.layout import TokenLayout

    rng = np.random.default_rng(seed)
    n = 1 + grid[0] * grid[1]
    logits = rng.normal(size=(layers, heads, n, n)) * np.arange(1, layers + 1)[:, None, None, None]
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    layout = TokenLayout(("cls",), grid, (8, 8), "token", 1)
    return attention, layout


def test_heads_groups_are_the_heads_pages_maps_one_row_per_layer():
    from vitviz.analyses.maps import layer_maps
    from vitviz.figures.paper_figure import heads_groups

    attention, layout = _attention()
    (group,) = heads_groups(attention, layout, [0, 2], "cls")
    assert group.name == "layers 1 and 3" and [r.label for r in group.rows] == ["layer 1", "layer 3"]
    assert group.rows[0].titles == ["head 1", "head 2"]
    np.testing.assert_array_equal(group.rows[1].maps, layer_maps(attention, layout, 2, "cls"))
    per_layer = heads_groups(attention, layout, [0, 2], "cls", one_scale=False)
    assert [g.name for g in per_layer] == ["layer 1", "layer 3"]
    fig = paper_figure(Image.new("RGB", (24, 24)), [group], title="t")
    # CLS row over the patches, numpy by hand: attention[l, h, 0, 1:]
    by_hand = np.stack([attention[l, h, 0, 1:] for l in (0, 2) for h in range(2)])
    # float64 attention rows, the same percentile arithmetic: <= 2 EPS64 apart
    assert fig.bars[0].mappable.norm.vmax == pytest.approx(np.percentile(by_hand, 99), rel=1e-12)
