"""The browser explorer on a page: one image's attention sent once, layer/head/query/display drawn in the browser.

``VITVIZ_DRAW=server`` keeps the server-drawn Plotly views (the tests' AppTests read those).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import streamlit as st

from ui.persist import remember_view
from vitviz.explorer import ExplorerPayload, explorer_payload
from vitviz.maps import RANKINGS

ASSETS = Path(__file__).resolve().parent.parent / "components" / "explorer"
_component = st.components.v2.component("vitviz_explorer", js=(ASSETS / "explorer.js").read_text(),
                                        css=(ASSETS / "explorer.css").read_text())


def browser_draws() -> bool:
    """Whether maps are drawn in the browser (default) or on the server (``VITVIZ_DRAW=server``)."""
    return os.environ.get("VITVIZ_DRAW", "browser").strip().lower() != "server"


def _payload(ctx, selected: int | None) -> ExplorerPayload:
    """The payload of the page's image, built once per image, model and (when rows are sent one patch at a
    time) selected patch; kept in the session, so a rerun sends the very same bytes (Streamlit then sends
    a reference to the message the browser already holds, not the bytes)."""
    r, layout = ctx.result, ctx.result.layout
    L, H = r.attention.shape[:2]
    name = (ctx.image.sha256, ctx.loaded.card()["spec"], tuple(r.attention.shape))
    held = st.session_state.get("explorer_payload")
    if held is not None and held[0] == name and (held[1].patch_rows or held[1].selected == selected):
        return held[1]
    scores = r.head_scores
    notes = np.array([[f"H {scores['entropy'][l, h]:.2f} nats · focus {scores['cls_focus'][l, h]:.2f} · "
                       f"{r.distance[l, h]:.0f} px" for h in range(H)] for l in range(L)], dtype=object)
    payload = explorer_payload(r.attention, layout, r.model_input,
                               sinks=[r.sinks.patch_sinks(layout, [l]) for l in range(L)], notes=notes,
                               scores={label: (scores[key], key != "entropy")
                                       for label, key in RANKINGS.items()},
                               selected=selected)
    st.session_state["explorer_payload"] = (name, payload)
    return payload


def heads_explorer(ctx, key: str = "heads_explorer") -> tuple[ExplorerPayload, dict | None]:
    """Mount the explorer for the page's image; returns the payload and the view the browser last reported."""
    reported = st.session_state.get(key)
    if reported and reported.get("view"):
        remember_view(reported["view"])  # before building the payload: a new patch's rows must be in it
    payload = _payload(ctx, st.session_state.get("patch"))
    result = _component(data=payload.data, key=key, on_view_change=lambda: None)
    view = result.get("view") if result is not None else None
    if view:
        remember_view(view)
    return payload, view
