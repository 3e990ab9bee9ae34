"""Figures of window attention (Swin): mean attention distance within windows against depth."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .core import qualitative_colours
from ..swin import WindowGeometry


def window_distance_figure(distance: list[np.ndarray], geometry: list[WindowGeometry], uniform: np.ndarray,
                           spread: list[np.ndarray] | None = None, n_images: int = 1) -> go.Figure:
    """The analogue of the ViT paper's Fig. 7 right for Swin: one dot per head and block.

    x = block (1-based, across stages), y = mean attention distance within windows in pixels of the
    model input. Stage boundaries are dashed lines with the stage's stride and window above them;
    the dotted steps are uniform attention over each query's window (the farthest a block can look
    on average). distance, spread: one (H_b,) array per block; uniform: (blocks,). Every dot's
    customdata is [block, head, stage] (1-based), for click handling.
    """
    n = len(geometry)
    heads = max(len(d) for d in distance)
    colours = qualitative_colours(heads)
    fig = go.Figure()
    for h in range(heads):
        blocks = np.array([b for b in range(n) if h < len(distance[b])])
        x = blocks + 1 + (h - (heads - 1) / 2) * min(0.6 / heads, 0.08)  # heads side by side, not on top
        custom = np.stack([blocks + 1, np.full(len(blocks), h + 1), [geometry[b].stage + 1 for b in blocks]]
                          + ([[spread[b][h] for b in blocks]] if spread is not None else []), -1)
        hover = "block %{customdata[0]} (stage %{customdata[2]}), head %{customdata[1]}<br>%{y:.1f} px"
        if spread is not None:
            hover += f" (± %{{customdata[3]:.1f}} std over {n_images} images)"
        fig.add_trace(go.Scatter(
            x=x, y=[distance[b][h] for b in blocks], mode="markers", name=f"head {h + 1}", customdata=custom,
            marker=dict(color=colours[h], size=9, line=dict(color="white", width=0.5)),
            error_y=dict(type="data", array=[spread[b][h] for b in blocks], thickness=1, width=2, color=colours[h])
            if spread is not None else None,
            hovertemplate=hover + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=np.arange(n + 1) + 0.5, y=np.append(uniform, uniform[-1]), mode="lines",
                             line_shape="hv", hoverinfo="skip", name="uniform attention over the window",
                             line=dict(color="black", dash="dot", width=1.5)))
    starts = [g.index for g in geometry if g.block == 0]
    top = max(float(np.nanmax(uniform)), max(float(np.max(d)) for d in distance)) * 1.12
    for i, first in enumerate(starts):
        g = geometry[first]
        last = starts[i + 1] - 1 if i + 1 < len(starts) else n - 1
        if first > 0:
            fig.add_vline(x=first + 0.5, line=dict(color="grey", dash="dash", width=1))
        fig.add_annotation(x=(first + last) / 2 + 1, y=top, yanchor="bottom", showarrow=False,
                           text=f"stage {g.stage + 1}<br>{g.stride[0]} px/token · {g.window_size[0]}×"
                                f"{g.window_size[1]} window", font=dict(size=11, color="black"))
    fig.update_layout(xaxis=dict(title="block (1-based, across stages)", tickmode="linear", dtick=1,
                                 range=[0.5, n + 0.5]),
                      yaxis=dict(title="mean attention distance within windows (pixels)", range=[0, top * 1.15]),
                      legend=dict(title="head (within its stage)<br>click a dot to open that block"), height=480,
                      margin=dict(l=70, r=10, t=10, b=50), plot_bgcolor="white", paper_bgcolor="white",
                      font_color="black", clickmode="event+select")
    fig.update_xaxes(showgrid=False, linecolor="black", ticks="outside")
    fig.update_yaxes(gridcolor="#e5e5e5", linecolor="black", ticks="outside")
    return fig
