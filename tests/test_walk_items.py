"""Walk items of issue 20 that need no app run: the overview grid's legend, one name per model on Compare,
a selected patch that keeps its place when the grid changes, the Overlay choice's wording."""
from PIL import Image

from vitviz.figures import patch_grid_image
from vitviz.layout import TokenLayout


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
