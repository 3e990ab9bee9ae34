"""A first visit's explanation: what a patch, a head, a layer and rollout are, and one click to a good first view."""
from __future__ import annotations

from pathlib import Path

import streamlit as st
from PIL import Image, ImageOps

from ui import keys
from ui.persist import INTRO_PARAM, SAVED
from ui.widgets import choose

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SEEN = INTRO_PARAM  # URL key: ?intro=0 once the explanation was closed, so a reload does not show it again
FIRST_VIEW = {"layer": "12", "query": "cls", "dir": "query"}  # the last layer's CLS heads outline objects


def _thumbnail(name: str) -> Image.Image:
    return ImageOps.fit(Image.open(ASSETS / name).convert("RGB"), (160, 160))


STATE = "intro_state"  # session: "open", "collapsed" (a one-line header on the first page) or "closed"
FIRST_PAGE = "intro_page"  # session: the page the explanation belongs to (the first one this session opened)


def _remember_closed() -> None:
    st.session_state.setdefault(SAVED, {})[SEEN] = "0"
    st.query_params[SEEN] = "0"


def _close() -> None:
    st.session_state[STATE] = "closed"
    _remember_closed()


def _toggled() -> None:
    """Collapsing the explanation remembers it as read: a reload (``?intro=0``) does not show it again."""
    st.session_state[STATE] = "open" if st.session_state.get("intro_expander") else "collapsed"
    _remember_closed()


def _open(name: str) -> None:
    _close()
    st.session_state.pop(keys.SAMPLES_BY_DEFAULT, None)  # a sample the user opened stays when they upload their own
    choose(keys.SAMPLE_PICKS, [name])
    choose(keys.CURRENT, name)
    st.session_state[SAVED].update(FIRST_VIEW)
    st.session_state["intro_open"] = True


def first_visit(page: str) -> bool:
    """The explanation at the top of the first page a session opens (``page``: its URL path), in an expander, until
    closed, collapsed (then a one-line header for this session) or a view is opened from it; other pages never
    show it, and a link or reload with ``?intro=0`` (written on close or collapse) does not either.

    Returns True when a sample was picked: the caller then switches to the heads page (after ``st.navigation``).
    """
    if st.session_state.pop("intro_open", False):
        return True
    state = st.session_state.get(STATE)
    if state is None:
        state = st.session_state[STATE] = "closed" if st.query_params.get(SEEN) == "0" else "open"
    first = st.session_state.setdefault(FIRST_PAGE, page)
    if state == "closed" or page != first:
        return False
    samples = sorted(p.name for p in ASSETS.glob("*.jpg"))
    with st.expander("New here? What vitviz shows", expanded=state == "open", key="intro_expander",
                     on_change=_toggled):
        st.markdown(
            "A Vision Transformer cuts the image into square **patches** (14×14 pixels for the bundled model) and "
            "turns each into a token. In every **layer**, each **head** lets every token look at every other token: "
            "its *attention* is a share for each patch, and the maps here colour those shares over the image. Early "
            "layers look nearby, late layers gather the object. **Rollout** multiplies the layers' attention "
            "together to follow what reaches the class token at the end.\n\n"
            "Start with a sample photo: it opens the last layer's heads, where the class token's attention "
            "outlines the object. Then move the layer slider or click a patch. (Collapse or close this box and "
            "it stays closed, after a reload too.)")
        cols = st.columns(len(samples) + 1)
        for col, name in zip(cols, samples):
            col.image(_thumbnail(name), caption=name)
            col.button(f"Open {name.removesuffix('.jpg')}", key=f"intro_{name}", on_click=_open, args=(name,))
        cols[-1].button("Close", key="intro_close", on_click=_close)
    return False
