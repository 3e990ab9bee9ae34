"""Walk items of issue 20 that need no app run: the overview grid's legend, one name per model on Compare,
a selected patch that keeps its place when the grid changes, the Overlay choice's wording."""
import numpy as np
from PIL import Image

from test_compare import stats_table
from vitviz.compare import combine
from vitviz.figures import patch_grid_image
from vitviz.layout import TokenLayout
from vitviz.sources import canonical_model_name


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
