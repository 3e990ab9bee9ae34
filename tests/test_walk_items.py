"""Walk items of issue 20 that need no app run: the overview grid's legend, one name per model on Compare,
a selected patch that keeps its place when the grid changes, the Overlay choice's wording."""
import numpy as np
from PIL import Image

from test_compare import stats_table
from vitviz.analyses.compare import combine
from vitviz.figures.explorer import explorer_payload, unpack
from vitviz.figures.core import patch_grid_image
from vitviz.layout import TokenLayout
from vitviz.figures.overlay import OVERLAY_HELP, OVERLAY_LABELS, OVERLAY_STYLES
from vitviz.sources.names import canonical_model_name


def _legend_entries(fig) -> list[str]:
    """The legend entries Plotly draws: none when the layout turns the legend off, else every trace that
    does not turn its own entry off (Plotly shows a legend once two or more traces would have one)."""
    spec = fig.to_plotly_json()
    if spec["layout"].get("showlegend") is False:
        return []
    shown = [t.get("name") or f"trace {i}" for i, t in enumerate(spec["data"])
             if t.get("type") not in ("image", "heatmap") and t.get("showlegend") is not False]
    return shown if len(shown) >= 2 or spec["layout"].get("showlegend") else []


def test_the_overview_patch_grid_draws_no_legend():
    """A stray "Aa trace 2" legend (the unnamed token-number text trace) sat beside the overview's grid."""
    layout = TokenLayout(("cls",), (16, 16), (14, 14), "token", 1)
    fig = patch_grid_image(Image.new("RGB", (224, 224), "orange"), layout, show_indices=True)
    assert any(t.type == "scatter" and t.mode == "text" for t in fig.data)  # the trace that made the entry is still drawn
    assert _legend_entries(fig) == []
    assert all(t.showlegend is False for t in fig.data if t.type == "scatter")


def test_one_model_has_one_name_on_compare():
    """`vitviz stats --model bundled` writes "bundled"; the app's run of the same model once wrote its long label,
    so Compare listed one model under two names. Both now go through canonical_model_name."""
    assert canonical_model_name("bundled") == "bundled"
    assert canonical_model_name("  bundled ") == "bundled"
    assert canonical_model_name("hf: google/vit-base-patch16-224") == "hf:google/vit-base-patch16-224"
    assert canonical_model_name("vit_small_patch14_dinov2.lvd142m") == "vit_small_patch14_dinov2.lvd142m"
    values = np.full((1, 2, 2), 10.0)
    table = combine({"stats.parquet": stats_table("bundled", values),
                     "this session": stats_table(" bundled", values + 1)})
    # Recognised as one model from two sources: told apart by source, never two unrelated names.
    assert sorted(table["model"].unique()) == ["bundled (stats.parquet)", "bundled (this session)"]


def _layout(grid: int, patch: int) -> TokenLayout:
    return TokenLayout(("cls",), (grid, grid), (patch, patch), "token", 1)


def test_a_selected_patch_keeps_its_place_in_the_image_when_the_grid_changes():
    """Reference: the centre pixel of the old patch, scaled to the new input size, looked up with patch_at."""
    old, new = _layout(16, 14), _layout(37, 14)  # the bundled model at 224 and at 518 px
    assert new.patch_from(8 * 16 + 8, (16, 16)) == 19 * 37 + 19
    for index in range(old.num_patches):
        row, col = divmod(index, 16)
        y, x = (row + 0.5) * 14 * 518 / 224, (col + 0.5) * 14 * 518 / 224
        assert new.patch_from(index, (16, 16)) == new.patch_at(x, y), index
    # Back to the old grid: every patch returns to itself; the same grid leaves the number alone.
    assert all(old.patch_from(new.patch_from(i, (16, 16)), (37, 37)) == i for i in range(old.num_patches))
    assert all(old.patch_from(i, (16, 16)) == i for i in range(old.num_patches))
    # A non-square grid: row 1 of 2 (centre at 3/4 of the height) is row 3 of 4; the last column stays the last.
    wide = TokenLayout(("cls",), (4, 8), (16, 16), "token", 1)
    assert wide.patch_from(15, (2, 8)) == 3 * 8 + 7
    assert _layout(2, 16).patch_from(31, (4, 8)) == 1 * 2 + 1


def test_the_overlay_choice_says_what_is_drawn():
    """"transparent where low" over an orange image left open what fades; the choice now reads as what it draws,
    the values kept in URLs and settings unchanged, and the browser's explorer shows the same words."""
    assert OVERLAY_STYLES == ("transparent where low", "heatmap", "DINO mask")
    assert OVERLAY_LABELS["transparent where low"] == "opacity follows the value (low values transparent)"
    assert "colour bar always gives a value's colour at full opacity" in OVERLAY_HELP
    assert "Opacity × √(its position on the colour scale)" in OVERLAY_HELP
    layout = _layout(2, 14)
    attention = np.full((1, 1, 5, 5), 0.2, np.float32)
    payload = explorer_payload(attention, layout, Image.new("RGB", (28, 28)), sinks=[np.zeros(0, int)])
    header, _ = unpack(payload.data)
    assert header["styles"] == list(OVERLAY_STYLES)
    assert header["style_labels"] == [OVERLAY_LABELS[s] for s in OVERLAY_STYLES]
    assert header["style_help"] == OVERLAY_HELP
