"""One guard for every page: an exception shows vitviz's sentence in place and the rest of the page is drawn.

``app.py`` runs each page inside :class:`guarded`, so whatever a page drew before a failure stays on
screen; pages wrap their independent sections (and their fragments, which rerun without app.py) in it
too, so a failure in one section leaves the sections after it. A :class:`~vitviz.errors.VitvizError`
(a user's file, setting or model) is shown as its own sentence; anything else is a bug: the sentence
names the section and the error's type and first line, and the traceback goes to the server's log, not
to the user. Streamlit's own control flow (``st.stop``, ``st.rerun``, ``st.switch_page``) passes through.
"""
from __future__ import annotations

import contextlib
import logging

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from vitviz.errors import VitvizError, first_line

log = logging.getLogger("vitviz.ui")


def sentence(exc: BaseException, what: str) -> str:
    """What the user reads for ``exc`` raised while drawing ``what``."""
    if isinstance(exc, VitvizError):
        return str(exc)
    return (f"vitviz could not draw {what} ({first_line(exc)}). This is a "
            "fault in vitviz, not in your image or settings; the rest of the page is shown, and the details are in "
            "the server's log.")


class guarded(contextlib.ContextDecorator):
    """``with guarded("the neuron maps"): ...`` or ``@guarded("the heads grid")``: an exception inside becomes one
    ``st.error`` sentence (:func:`sentence`) where the section stands, and the page goes on after it."""

    def __init__(self, what: str = "this part of the page"):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, ScriptControlException):
            return False
        if not isinstance(exc, VitvizError):
            log.error("Error while drawing %s", self.what, exc_info=(kind, exc, tb))
        st.error(sentence(exc, self.what))
        return True
