"""State that survives a reload, a shared link and a page switch: the view lives in the URL and the session.

The browser explorer writes its view (layer, query, patch, display) into the URL itself as it
repaints and tells the server afterwards; :func:`remember_view` keeps the server's copy in the
session, so a page switch (which starts with a clean URL) puts it back with :func:`restore_params`.
"""
from __future__ import annotations

import streamlit as st

# URL key -> (session key of the same choice on the server-drawn pages, or None).
VIEW_PARAMS = {"layer": "heads_layer", "query": None, "dir": None, "patch": "patch", "keep": "keep",
               "order": "ranking", "cmap": "cmap", "scale": "scale_mode", "style": "style", "opacity": "opacity",
               "sinks": "exclude_sinks"}
SAVED = "persist_params"


def _text(value) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def remember_view(view: dict) -> None:
    """Keep the explorer's view in the session and the URL (the browser has already written the URL;
    writing the same values keeps Streamlit's copy of the query string in step)."""
    params = {k: _text(v) for k, v in view.items() if k in VIEW_PARAMS and v is not None}
    saved = st.session_state.setdefault(SAVED, {})
    saved.update(params)
    if view.get("patch") is None:
        saved.pop("patch", None)
    st.session_state["patch"] = None if view.get("patch") is None else int(view["patch"])
    changed = {k: v for k, v in params.items() if st.query_params.get(k) != v}
    if changed:
        st.query_params.update(changed)


def restore_params() -> None:
    """Put the session's saved view back into the URL when a page switch dropped it, and pick up a
    view that arrived in the URL (F5, a shared link) as the session's own."""
    saved = st.session_state.setdefault(SAVED, {})
    for key in VIEW_PARAMS:
        if key in st.query_params:
            saved[key] = st.query_params[key]
    missing = {k: v for k, v in saved.items() if k not in st.query_params}
    if missing:
        st.query_params.update(missing)
    if "patch" in saved and st.session_state.get("patch") is None:
        try:
            st.session_state["patch"] = int(saved["patch"])
        except ValueError:
            saved.pop("patch")


def saved_view() -> dict[str, str]:
    """The view as last written (URL keys, text values)."""
    return dict(st.session_state.get(SAVED, {}))
