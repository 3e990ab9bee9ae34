"""Plotly figure builders: arrays in, ``go.Figure`` out. No Streamlit here.

Images travel to the browser as PNG/JPEG data URIs; maps as their gh x gw values (never
upsampled), so a figure stays small.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from PIL import Image

from .layout import TokenLayout

AXES_OFF = dict(visible=False)


def image_data_uri(image: Image.Image, fmt: str = "PNG") -> str:
    """The image inline: a few kB to the browser instead of a JSON array of pixels."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _map_trace(grid_map, layout: TokenLayout, opacity: float, colorscale: str, zmin=None, zmax=None,
               showscale=True, name="attention") -> go.Heatmap:
    ph, pw = layout.patch_size
    rows, cols = np.indices(grid_map.shape)
    return go.Heatmap(
        z=np.asarray(grid_map, dtype=np.float32), x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, opacity=opacity,
        colorscale=colorscale, zmin=zmin, zmax=zmax, showscale=showscale, name=name,
        colorbar=dict(title=name, thickness=12),
        customdata=np.stack([rows, cols, rows * grid_map.shape[1] + cols], axis=-1),
        hovertemplate="patch %{customdata[2]} (row %{customdata[0]}, col %{customdata[1]})<br>"
                      + name + " %{z:.4f}<extra></extra>",
    )


def _patch_box(layout: TokenLayout, patch: int, colour: str = "cyan") -> dict:
    gh, gw = layout.grid_size
    ph, pw = layout.patch_size
    r, c = divmod(int(patch), gw)
    return dict(type="rect", x0=c * pw, x1=(c + 1) * pw, y0=r * ph, y1=(r + 1) * ph,
                line=dict(color=colour, width=2))


def attention_overlay(image: Image.Image, grid_map: np.ndarray, layout: TokenLayout, *, opacity: float = 0.6,
                      colorscale: str = "Inferno", title: str = "", mask: np.ndarray | None = None,
                      highlight: int | None = None, name: str = "attention", zmin=None, zmax=None) -> go.Figure:
    """A (gh, gw) map drawn over the model-input image, one cell per patch.

    mask: (gh, gw) bool; cells outside it are left transparent. highlight: a patch index to outline.
    """
    shown = np.where(mask, grid_map, np.nan) if mask is not None else grid_map
    fig = go.Figure(go.Image(source=image_data_uri(image, "JPEG")))
    fig.add_trace(_map_trace(shown, layout, opacity, colorscale, zmin, zmax, name=name))
    if highlight is not None:
        fig.add_shape(_patch_box(layout, highlight))
    fig.update_layout(title=title, margin=dict(l=0, r=0, t=30 if title else 0, b=0),
                      xaxis=AXES_OFF, yaxis=dict(visible=False, scaleanchor="x"))
    return fig


def overlay_grid(image: Image.Image, maps: np.ndarray, layout: TokenLayout, titles: list[str], *,
                 columns: int = 3, opacity: float = 0.6, colorscale: str = "Inferno",
                 masks: np.ndarray | None = None, highlight: int | None = None, shared_scale: bool = False) -> go.Figure:
    """Several (gh, gw) maps, e.g. every head of a layer, each over the image. maps: (k, gh, gw)."""
    k = len(maps)
    rows = -(-k // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.06)
    uri = image_data_uri(image, "JPEG")
    zmin, zmax = (float(np.min(maps)), float(np.max(maps))) if shared_scale else (None, None)
    for i, grid_map in enumerate(maps):
        r, c = divmod(i, columns)
        shown = np.where(masks[i], grid_map, np.nan) if masks is not None else grid_map
        fig.add_trace(go.Image(source=uri), row=r + 1, col=c + 1)
        fig.add_trace(_map_trace(shown, layout, opacity, colorscale, zmin, zmax, showscale=False), row=r + 1, col=c + 1)
        if highlight is not None:
            fig.add_shape(_patch_box(layout, highlight), row=r + 1, col=c + 1)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(height=260 * rows, margin=dict(l=0, r=0, t=30, b=0))
    return fig


def patch_grid_image(image: Image.Image, layout: TokenLayout, show_indices: bool = True) -> go.Figure:
    """The model-input image with the patch grid and raster-order token indices (prefix tokens first)."""
    gh, gw = layout.grid_size
    ph, pw = layout.patch_size
    fig = go.Figure(go.Image(source=image_data_uri(image)))
    for r in range(gh + 1):
        fig.add_shape(type="line", x0=0, x1=gw * pw, y0=r * ph, y1=r * ph, line=dict(color="white", width=1))
    for c in range(gw + 1):
        fig.add_shape(type="line", x0=c * pw, x1=c * pw, y0=0, y1=gh * ph, line=dict(color="white", width=1))
    if show_indices:
        centres = layout.patch_centres()
        tokens = np.arange(layout.num_patches) + layout.num_prefix_tokens
        fig.add_trace(go.Scatter(x=centres[:, 1], y=centres[:, 0], mode="text", text=[str(t) for t in tokens],
                                 textfont=dict(color="yellow", size=8), hoverinfo="text",
                                 hovertext=[layout.token_name(int(t)) for t in tokens]))
    fig.update_layout(margin=dict(l=0, r=0, t=0, b=0), xaxis=AXES_OFF, yaxis=dict(visible=False, scaleanchor="x"))
    return fig


def rgb_image(array: np.ndarray | Image.Image, title: str = "", scale: int = 1) -> go.Figure:
    """An image, or an (h, w, 3) array in [0, 1] or uint8, enlarged ``scale`` times without smoothing."""
    if isinstance(array, Image.Image):
        im = array
    else:
        im = Image.fromarray(array if array.dtype == np.uint8 else np.round(np.clip(array, 0, 1) * 255).astype(np.uint8))
    if scale > 1:
        im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
    fig = go.Figure(go.Image(source=image_data_uri(im)))
    fig.update_layout(title=title, margin=dict(l=0, r=0, t=30 if title else 0, b=0),
                      xaxis=AXES_OFF, yaxis=dict(visible=False, scaleanchor="x"))
    return fig


def token_norm_map(norms: np.ndarray, layout: TokenLayout, artifacts: np.ndarray) -> go.Figure:
    """Output-token norms of the patches as a (gh, gw) heatmap; artifact tokens marked with x."""
    grid = layout.to_grid(norms[layout.patch_slice])
    fig = go.Figure(go.Heatmap(z=grid.astype(np.float32), colorscale="Viridis", colorbar=dict(title="norm"),
                               hovertemplate="row %{y}, col %{x}<br>norm %{z:.1f}<extra></extra>"))
    if len(artifacts):
        p = np.asarray(artifacts) - layout.num_prefix_tokens
        fig.add_trace(go.Scatter(x=p % layout.grid_size[1], y=p // layout.grid_size[1], mode="markers",
                                 marker=dict(symbol="x", size=12, color="red"), name="artifact (>10x median)",
                                 hovertemplate="artifact token %{text}<extra></extra>", text=[str(t) for t in artifacts]))
    fig.update_layout(margin=dict(l=0, r=0, t=0, b=0), yaxis=dict(autorange="reversed", scaleanchor="x"),
                      legend=dict(orientation="h"))
    return fig


def distance_scatter(distance: np.ndarray, receptive_field: np.ndarray | None = None,
                     spread: np.ndarray | None = None) -> go.Figure:
    """ViT paper Fig. 7 right: network depth on x, mean attention distance on y, one dot per head.

    distance: (L, H) pixels; receptive_field: (L,) pixels; spread: (L, H) std over images (hover).
    """
    L, H = distance.shape
    layers, heads = np.meshgrid(np.arange(1, L + 1), np.arange(1, H + 1), indexing="ij")
    custom = np.stack([layers.ravel(), heads.ravel()] + ([spread.ravel()] if spread is not None else []), -1)
    hover = "layer %{customdata[0]}, head %{customdata[1]}<br>%{y:.1f} px"
    if spread is not None:
        hover += " (std over images %{customdata[2]:.1f})"
    fig = go.Figure(go.Scatter(x=layers.ravel(), y=distance.ravel(), mode="markers", name="heads",
                               marker=dict(color=heads.ravel(), colorscale="Viridis", size=9),
                               customdata=custom, hovertemplate=hover + "<extra></extra>"))
    if receptive_field is not None:
        fig.add_trace(go.Scatter(x=np.arange(1, L + 1), y=receptive_field, mode="lines", name="3x3 conv stack receptive field",
                                 line=dict(color="grey", dash="dash")))
    fig.update_layout(xaxis_title="network depth (layer)", yaxis_title="mean attention distance (pixels)",
                      legend=dict(orientation="h"), margin=dict(l=0, r=0, t=10, b=0))
    return fig


def layer_head_heatmap(values: np.ndarray, title: str, colorbar: str) -> go.Figure:
    """(L, H) values, layers down, heads across (1-based labels)."""
    L, H = values.shape
    fig = go.Figure(go.Heatmap(z=values.astype(np.float32), x=np.arange(1, H + 1), y=np.arange(1, L + 1),
                               colorscale="Viridis", colorbar=dict(title=colorbar),
                               hovertemplate="layer %{y}, head %{x}<br>%{z:.2f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer", yaxis=dict(autorange="reversed"),
                      margin=dict(l=0, r=0, t=30, b=0))
    return fig


def bars(values: np.ndarray, title: str, x_title: str, y_title: str, labels=None) -> go.Figure:
    x = labels if labels is not None else np.arange(1, len(values) + 1)
    fig = go.Figure(go.Bar(x=x, y=values))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, margin=dict(l=0, r=0, t=30, b=0))
    return fig


def similarity_grid(similarity: np.ndarray, gap: int = 1) -> go.Figure:
    """ViT paper Fig. 7 centre: (gh, gw, gh, gw) cosine maps tiled in one heatmap, fixed -1..1 scale."""
    gh, gw = similarity.shape[:2]
    H, W = gh * (gh + gap) - gap, gw * (gw + gap) - gap
    canvas = np.full((H, W), np.nan, dtype=np.float32)
    for r in range(gh):
        for c in range(gw):
            canvas[r * (gh + gap):r * (gh + gap) + gh, c * (gw + gap):c * (gw + gap) + gw] = similarity[r, c]
    fig = go.Figure(go.Heatmap(z=canvas, zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                               colorbar=dict(title="cosine"), hoverongaps=False,
                               hovertemplate="%{z:.2f}<extra></extra>"))
    fig.update_layout(xaxis=AXES_OFF, yaxis=dict(visible=False, autorange="reversed", scaleanchor="x"),
                      margin=dict(l=0, r=0, t=0, b=0), height=640)
    return fig


def similarity_map(grid_map: np.ndarray, position: tuple[int, int]) -> go.Figure:
    """One position's cosine-similarity map, enlarged, fixed -1..1 scale, the position marked."""
    fig = go.Figure(go.Heatmap(z=grid_map.astype(np.float32), zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                               colorbar=dict(title="cosine"), hovertemplate="row %{y}, col %{x}<br>%{z:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[position[1]], y=[position[0]], mode="markers", showlegend=False,
                             marker=dict(symbol="square-open", size=14, color="black")))
    fig.update_layout(yaxis=dict(autorange="reversed", scaleanchor="x"), margin=dict(l=0, r=0, t=0, b=0))
    return fig
