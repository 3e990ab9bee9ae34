"""The browser explorer on a page: one image's maps sent once, layer/head/depth/query/display drawn in the browser.

One component (``components/explorer/``), two views: the heads grid with Compare layers below it
(:func:`heads_explorer`) and the rollout after a chosen layer (:func:`rollout_explorer`).
``VITVIZ_DRAW=server`` keeps the server-drawn Plotly views (the tests' AppTests read those).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import streamlit as st

from ui import keys
from ui.numbers import number
from ui.persist import remember_view, saved_view
from vitviz.figures.explorer import ExplorerPayload, explorer_payload, rollout_payload
from vitviz.analyses.maps import RANKINGS, head_notes

ASSETS = Path(__file__).resolve().parent.parent / "components" / "explorer"
_component = st.components.v2.component("vitviz_explorer", js=(ASSETS / "explorer.js").read_text(),
                                        css=(ASSETS / "explorer.css").read_text())


def browser_draws() -> bool:
    """Whether maps are drawn in the browser (default) or on the server (``VITVIZ_DRAW=server``)."""
    return os.environ.get("VITVIZ_DRAW", "browser").strip().lower() != "server"


def _held(key: str, name: tuple, selected: int | None, build: Callable[[], ExplorerPayload]) -> ExplorerPayload:
    """The payload named ``name``, built once (and again for another selected patch when rows are sent one patch
    at a time); kept in the session, so a rerun sends the very same bytes (Streamlit then sends a reference to
    the message the browser already holds, not the bytes)."""
    held = st.session_state.get(f"{key}_payload")
    if held is not None and held[0] == name and (held[1].patch_rows or held[1].selected == selected):
        return held[1]
    payload = build()
    st.session_state[f"{key}_payload"] = (name, payload)
    return payload


def _mount(key: str, payload: Callable[[], ExplorerPayload]) -> tuple[ExplorerPayload, dict | None]:
    """Take the view the browser reported, then mount the component with the payload for it."""
    reported = st.session_state.get(key)
    if reported and reported.get("view"):
        remember_view(reported["view"])  # before building the payload: a new patch's rows must be in it
    data = payload()
    result = _component(data=data.data, key=key, on_view_change=lambda: None)
    view = result.get("view") if result is not None else None
    if view:
        remember_view(view)
    return data, view


def heads_payload(ctx, selected: int | None) -> ExplorerPayload:
    """The heads grid's payload for the page's image: every layer's maps, sinks, tile notes and rankings;
    ``selected``: the clicked patch (0-based), whose rows are sent when not every patch's are."""
    r, layout = ctx.result, ctx.result.layout
    scores = r.head_scores
    return explorer_payload(r.attention, layout, r.model_input,
                            sinks=[r.sinks.patch_sinks(layout, [l]) for l in range(r.attention.shape[0])],
                            notes=head_notes(scores, r.distance),
                            scores={label: (scores[key], key != "entropy") for label, key in RANKINGS.items()},
                            selected=selected, padding=ctx.padding)


def heads_explorer(ctx, key: str = "heads_explorer") -> tuple[ExplorerPayload, dict | None]:
    """Mount the heads grid (and Compare layers) for the page's image; returns the payload and the view the
    browser last reported."""
    r = ctx.result
    name = (ctx.image.sha256, ctx.loaded.card()["spec"], tuple(r.attention.shape), tuple(ctx.padding.tolist()))

    def payload() -> ExplorerPayload:
        selected = st.session_state.get(keys.PATCH)  # read after _mount took the view the browser reported
        return _held(key, name, selected, lambda: heads_payload(ctx, selected))

    return _mount(key, payload)


@dataclass
class RolloutView:
    """What the browser's rollout view shows: the payload, whether a clicked patch is read out, the depth (1-based)."""

    payload: ExplorerPayload
    reads_patch: bool
    depth: int


def rollout_explorer(ctx, *, fusion: str, discard: float, start: int, end: int, exclude_tokens: tuple[int, ...],
                     sinks: np.ndarray, display, key: str = "rollout_explorer") -> RolloutView:
    """Mount the rollout view: depth and read-out patch drawn in the browser for these settings (layer range
    [start, end), 0-based) and the page's display choices (:class:`ui.display.Display`); returns the view as the
    browser last reported it (or the URL holds it)."""
    r = ctx.result
    shown = {"cmap": display.cmap, "scale": display.scale_mode, "style": display.style, "opacity": display.opacity,
             "sinks": display.exclude_sinks, "smooth": display.smooth, "clip": display.outline_clipped}

    def build() -> ExplorerPayload:
        return rollout_payload(r.attention, r.layout, r.model_input, fusion=fusion, discard=discard, start=start,
                               end=end, exclude_tokens=exclude_tokens, sinks=sinks, display=shown,
                               selected=st.session_state.get(keys.PATCH), padding=np.array(display.padding, dtype=int))

    name = (ctx.image.sha256, ctx.loaded.card()["spec"], tuple(r.attention.shape), fusion, discard, start, end,
            tuple(exclude_tokens), tuple(np.asarray(sinks, int).tolist()), tuple(sorted(shown.items())), display.padding)
    payload, _ = _mount(key, lambda: _held(key, name, st.session_state.get(keys.PATCH), build))
    saved = saved_view()
    asked = number(saved.get("depth", end))
    depth = end if asked is None else int(min(end, max(start + 1, asked)))
    return RolloutView(payload, saved.get("readout") == "patch", depth)
