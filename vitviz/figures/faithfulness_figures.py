"""Plotly figures of deletion/insertion curves: arrays in, ``go.Figure`` out. No Streamlit here."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..explainers import registered
from ..perturbation.curves import MODES
from .core import qualitative_colours
from ..words import counted

FLOOR = "random"


def method_label(name: str) -> str:
    """Screen name of a method key: ``last_layer_head_3`` -> ``last layer, head 3``."""
    if name == "last_layer_mean":
        return "last layer, mean of heads"
    if name.startswith("last_layer_head_"):
        return f"last layer, head {name.rsplit('_', 1)[1]}"
    method = registered().get(name)
    return method.label if method is not None else name.replace("_", " ")


def method_unit(name: str) -> str:
    """What a method's map values are, for its colour bar."""
    if name.startswith("last_layer"):
        return "attention weight"
    return {"rollout": "rollout mass", "gradient_rollout": "relevance", "attention_flow": "flow (attention mass)",
            "random": "random value", "occlusion": "score drop"}.get(name, "relevance" if name in registered() else
                                                                       "map value")


def score_axis(score: str) -> str:
    """A short axis title for a score description."""
    return "cosine to the original (pre-logits)" if "cosine" in score else score.replace("softmax probability", "P")


def method_colours(methods: list[str]) -> dict[str, str]:
    """One colour per method, the random floor grey: the same in every figure of the page."""
    colours = iter(qualitative_colours(len(methods)))
    return {m: "#9e9e9e" if m == FLOOR else next(colours) for m in methods}


def curves_figure(fractions: np.ndarray, deletion: np.ndarray, insertion: np.ndarray, methods: list[str],
                  score: str, auc: dict[str, tuple[float, float]], *, height: int = 420) -> go.Figure:
    """Deletion and insertion curves side by side, one line per method (legend: name and AUC).

    fractions: (S,); deletion, insertion: (M, S); auc: method -> (deletion AUC, insertion AUC).
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("Deletion (lower AUC = more faithful)", "Insertion (higher AUC = more faithful)"))
    colours = method_colours(methods)
    for col, (mode, curves) in enumerate(zip(MODES, (deletion, insertion)), start=1):
        for name, curve in zip(methods, curves):
            d, i = auc[name]
            fig.add_trace(go.Scatter(
                x=fractions, y=curve, mode="lines+markers", name=f"{method_label(name)} · AUC del {d:.3f} / ins {i:.3f}",
                legendgroup=name, showlegend=col == 1, marker=dict(size=5),
                line=dict(color=colours[name], width=2.5 if name in ("rollout", "attention_flow", "gradient_rollout")
                          else 1.5, dash="dash" if name == FLOOR else "solid"),
                hovertemplate=f"{method_label(name)}<br>{mode} of %{{x:.0%}} of patches<br>score %{{y:.3f}}<extra></extra>"),
                row=1, col=col)
        fig.update_xaxes(title_text="fraction of patches " + ("deleted" if mode == "deletion" else "inserted"),
                         tickformat=".0%", range=[-0.02, 1.02], row=1, col=col)
        fig.update_yaxes(title_text=score_axis(score), row=1, col=col)
    # t=72: the subplot titles sit below the chart toolbar (which covered "Insertion ..." at t=40).
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=72, b=50), template="plotly_white",
                      legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0, font=dict(size=11)))
    return fig


def method_curve_figure(fractions: np.ndarray, deletion: np.ndarray, insertion: np.ndarray, name: str, score: str,
                        floor: tuple[np.ndarray, np.ndarray] | None = None, *, height: int = 300) -> go.Figure:
    """One method's two curves (and the random floor's, dotted) for the row beside its map. (S,) arrays."""
    fig = go.Figure()
    styles = {"deletion": "#d62728", "insertion": "#1f77b4"}
    if floor is not None:
        for mode, curve in zip(MODES, floor):
            fig.add_trace(go.Scatter(x=fractions, y=curve, mode="lines", name=f"{mode}, random floor",
                                     line=dict(color=styles[mode], dash="dot", width=1), opacity=0.6))
    for mode, curve in zip(MODES, (deletion, insertion)):
        fig.add_trace(go.Scatter(x=fractions, y=curve, mode="lines+markers", name=mode, marker=dict(size=5),
                                 line=dict(color=styles[mode], width=2)))
    fig.update_layout(height=height, template="plotly_white", margin=dict(l=55, r=10, t=36, b=40),
                      title=dict(text=method_label(name), font=dict(size=14)),
                      xaxis=dict(title="fraction of patches", tickformat=".0%"), yaxis=dict(title=score_axis(score)),
                      legend=dict(font=dict(size=10)))
    return fig


def dataset_figure(block: dict, protocol_label: str, *, height: int | None = None) -> go.Figure:
    """Mean AUC over images per method with its bootstrap 95 % interval, beside the random floor's band.

    block: one protocol of :func:`vitviz.perturbation.stats.summarise` (``methods``, ``random_seeds``, ``better``).
    The shaded band is the random seeds' set means, mean ± 2 s.d. over seeds.
    """
    rows = block["methods"]
    names = [method_label(r["method"]) for r in rows]
    colours = method_colours([r["method"] for r in rows])
    fig = go.Figure()
    seeds = block.get("random_seeds")
    if seeds:
        lo, hi = seeds["mean"] - 2 * seeds["sd_over_seeds"], seeds["mean"] + 2 * seeds["sd_over_seeds"]
        fig.add_vrect(x0=lo, x1=hi, fillcolor="rgb(200,200,200)", opacity=0.45, line_width=0, layer="below",
                      annotation_text=f"random: {seeds['seeds']} seeds, mean ± 2 s.d.", annotation_position="top left",
                      annotation_font_size=11)
    for r, name in zip(rows, names):
        fig.add_trace(go.Scatter(
            x=[r["mean"]], y=[name], mode="markers", marker=dict(size=11, color=colours[r["method"]],
                                                                 symbol="diamond" if r["method"] == FLOOR else "circle"),
            error_x=dict(type="data", symmetric=False, array=[r["high"] - r["mean"]], arrayminus=[r["mean"] - r["low"]],
                         thickness=2, width=6, color=colours[r["method"]]),
            showlegend=False,
            hovertemplate=f"{name}<br>mean AUC %{{x:.3f}}<br>95 % interval {r['low']:.3f} to {r['high']:.3f}"
                          f"<br>{counted(r['images'], 'image')}<extra></extra>"))
    fig.update_xaxes(title_text=f"mean AUC over images ({block['better']} is more faithful)", zeroline=False)
    fig.update_yaxes(autorange="reversed", title_text=None)
    fig.update_layout(height=height or 110 + 42 * len(rows), template="plotly_white",
                      margin=dict(l=10, r=20, t=50, b=50),
                      title=dict(text=f"{protocol_label}: mean AUC with bootstrap 95 % interval", font=dict(size=14)))
    return fig
