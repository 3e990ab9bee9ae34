"""The probes' figure: accuracy per layer with its cross-validated interval and the chance level."""
from __future__ import annotations

import plotly.graph_objects as go

LINE = "rgb(31, 119, 180)"
CHANCE = "rgb(120, 120, 120)"


def accuracy_figure(table: list[dict], chance: float, head_layer: int | None = None, title: str = "") -> go.Figure:
    """Out-of-fold accuracy against layer (1-based) with 95 % Wilson intervals as error bars, chance dashed.

    Args:
        table: :attr:`vitviz.probes.ProbeResult.table` rows (``layer``, ``accuracy``, ``low``, ``high``).
        chance: the majority class's share (0..1).
        head_layer: the head's layer, marked; None for no mark.
    """
    layers = [r["layer"] for r in table]
    acc = [100 * r["accuracy"] for r in table]
    fig = go.Figure(go.Scatter(
        x=layers, y=acc, mode="lines+markers", name="probe accuracy (out-of-fold)", line=dict(color=LINE),
        error_y=dict(type="data", symmetric=False, array=[100 * r["high"] - a for r, a in zip(table, acc)],
                     arrayminus=[a - 100 * r["low"] for r, a in zip(table, acc)], color=LINE, thickness=1.2),
        customdata=[[100 * r["low"], 100 * r["high"]] for r in table],
        hovertemplate="layer %{x}<br>accuracy %{y:.1f}%<br>95%% interval %{customdata[0]:.1f}–%{customdata[1]:.1f}%"
                      "<extra></extra>"))
    fig.add_trace(go.Scatter(x=[min(layers) - 0.4, max(layers) + 0.4], y=[100 * chance] * 2, mode="lines",
                             line=dict(color=CHANCE, dash="dash"), name=f"chance (largest class) {100 * chance:.0f}%",
                             hoverinfo="skip"))
    if head_layer is not None:
        row = next(r for r in table if r["layer"] == head_layer)
        fig.add_trace(go.Scatter(x=[head_layer], y=[100 * row["accuracy"]], mode="markers", name="the head's layer",
                                 marker=dict(symbol="star", size=16, color="rgb(214, 39, 40)"), hoverinfo="skip"))
    fig.update_layout(title=title or "What each layer knows: linear-probe accuracy per layer", height=420,
                      margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.18),
                      template="plotly_white")
    fig.update_xaxes(title="layer (1-based)", dtick=1, range=[min(layers) - 0.5, max(layers) + 0.5])
    fig.update_yaxes(title="accuracy (%), 95% Wilson interval", range=[0, 102])
    return fig
