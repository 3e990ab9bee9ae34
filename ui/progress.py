"""Expensive per-image computations with a progress bar, cached for every session.

``st.cache_data`` would replay a progress bar drawn inside it; here the bar is drawn only
while computing, and the value is kept in a bounded store shared by all sessions.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

import streamlit as st

T = TypeVar("T")
MAX_ENTRIES = 32


@st.cache_resource
def _store() -> tuple[OrderedDict, threading.Lock]:
    return OrderedDict(), threading.Lock()


def cached(key: Hashable) -> object | None:
    """The stored value for ``key``, or None."""
    store, lock = _store()
    with lock:
        return store.get(key)


def with_progress(key: Hashable, label: str, compute: Callable[[Callable[[int, int], None]], T]) -> T:
    """``compute(progress)`` once per key, showing a progress bar; ``progress(done, total)`` moves it."""
    value = cached(key)
    if value is not None:
        return value
    bar = st.progress(0.0, text=label)
    value = compute(lambda done, total: bar.progress(done / total, text=f"{label} {done} of {total}"))
    bar.empty()
    store, lock = _store()
    with lock:
        store[key] = value
        while len(store) > MAX_ENTRIES:
            store.popitem(last=False)
    return value
