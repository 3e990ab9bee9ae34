"""Memory of the sidebar's widgets across page switches.

Streamlit gives a widget on another page another identity, so a page switch re-creates every sidebar widget with
its default value. Each widget's value is therefore kept under :func:`ui.keys.kept` (written by its ``on_change``,
i.e. only by the user) and seeded back into the widget on every run: ``st.selectbox(..., **kept_args(key))``.
"""
from __future__ import annotations

import streamlit as st

from .keys import RESEED, kept


def _remember(key: str) -> None:
    # A widget change and a page switch can reach a busy server in one request: the page left's callbacks then run
    # at the start of the next page's run, where that widget may hold no value; there is nothing to keep then.
    if key in st.session_state:
        st.session_state[kept(key)] = st.session_state[key]


def kept_args(key: str, options: list | None = None) -> dict:
    """Widget arguments that keep the user's value across page switches.

    Seeds the widget from its kept value unless that value is no longer among ``options`` (a list value keeps its
    members that are), and returns ``key`` and ``on_change`` for the widget call.
    """
    if key in st.session_state.get(RESEED, ()):
        # After a failed load the code moved this widget back (ui.recovery): its last value from the browser goes,
        # or Streamlit would take the browser's next pick of that same value for no change.
        st.session_state[RESEED].discard(key)
        st.session_state.pop(key, None)
    if kept(key) in st.session_state:
        value = st.session_state[kept(key)]
        if options is not None and isinstance(value, list):
            value = [v for v in value if v in options]
        if options is None or isinstance(value, list) or value in options:
            st.session_state[key] = value
    return {"key": key, "on_change": _remember, "args": (key,)}


def choose(key: str, value) -> None:
    """Set a kept widget's value from code (the widget must not have been drawn yet this run)."""
    st.session_state[kept(key)] = value


def chosen(key: str, default=None):
    """A widget's value as the user last set it (its kept value), or ``default``."""
    return st.session_state.get(kept(key), default)


def forget(key: str) -> None:
    """Drop a widget's kept value: it shows its default on the next run."""
    st.session_state.pop(kept(key), None)


def reseed(keys) -> None:
    """Drop the browser's value of these widgets on their next run (see :func:`kept_args`)."""
    st.session_state.setdefault(RESEED, set()).update(keys)
