"""State that survives a reload, a shared link and a page switch: the view lives in the URL and the session.

The browser explorer writes its view (layer, query, patch, display) into the URL itself as it
repaints and tells the server afterwards; :func:`remember_view` keeps the server's copy in the
session, so a page switch (which starts with a clean URL) puts it back with :func:`restore_params`.
"""
from __future__ import annotations

import hashlib
import os

import streamlit as st

from ui.memo import ByteLRU
from ui import keys
from ui.numbers import whole
from ui.widgets import choose
from vitviz.words import file_size

# URL key -> (session key of the same choice on the server-drawn pages, or None).
VIEW_PARAMS = {"layer": keys.HEADS_LAYER, "query": None, "dir": None, "patch": "patch", "keep": "keep",
               "order": "ranking", "cmap": "cmap", "scale": "scale_mode", "style": "style", "opacity": "opacity",
               "sinks": "exclude_sinks", "clip": "outline_clipped", "pad": "exclude_padding",
               # the heads page's Compare layers (head 1-based, panel count, the panels' layers "1,12")
               "chead": keys.COMPARE_HEAD, "cn": "compare_n", "cl": None,
               # the rollout page (depth 1-based; readout "readout" or "patch")
               "depth": "rollout_depth", "readout": "rollout_readout"}
SAVED = "persist_params"
INTRO_PARAM = "intro"  # ui.onboarding.SEEN: ?intro=0 once the first-visit box was closed
PATCH_GRID = "patch_grid"  # (rows, cols) of the grid the selected patch was picked on
STALE_PATCH = "patch_before_grid_change"


def _text(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def remember_view(view: dict) -> None:
    """Keep the explorer's view in the session and the URL (the browser has already written the URL;
    writing the same values keeps Streamlit's copy of the query string in step)."""
    params = {k: _text(v) for k, v in view.items() if k in VIEW_PARAMS and v is not None}
    saved = st.session_state.setdefault(SAVED, {})
    saved.update(params)
    if view.get("patch") is None:
        saved.pop("patch", None)
    patch = None if view.get("patch") is None else int(view["patch"])
    if patch is not None and patch == st.session_state.get(STALE_PATCH):
        # The browser's last report still names the patch by the old grid's number: keep the mapped one.
        patch = st.session_state.get(keys.PATCH)
        params.pop("patch", None)
        if patch is not None:
            saved["patch"] = str(patch)
    else:
        st.session_state.pop(STALE_PATCH, None)
    st.session_state[keys.PATCH] = patch
    changed = {k: v for k, v in params.items() if st.query_params.get(k) != v}
    if changed:
        st.query_params.update(changed)


def set_view(**params) -> None:
    """Set view keys from code (e.g. a head opened from the distance plot); a page switch carries them."""
    saved = st.session_state.setdefault(SAVED, {})
    saved.update({k: _text(v) for k, v in params.items()})
    st.query_params.update({k: _text(v) for k, v in params.items()})


def restore_params() -> None:
    """Put the session's saved view back into the URL when a page switch dropped it, and pick up a
    view that arrived in the URL (F5, a shared link) as the session's own."""
    saved = st.session_state.setdefault(SAVED, {})
    # ``intro`` too: a session started by F5 on ``?intro=0`` must carry it to the next page, or F5 there (a new
    # session on a URL without it) would show the first-visit box again (close, F5, switch page, F5).
    for key in (*VIEW_PARAMS, INTRO_PARAM):
        if key in st.query_params:
            saved[key] = st.query_params[key]
    missing = {k: v for k, v in saved.items() if k not in st.query_params and (k in VIEW_PARAMS or k == INTRO_PARAM)}
    if missing:
        st.query_params.update(missing)
    if "patch" in saved and st.session_state.get(keys.PATCH) is None:
        patch = whole(saved["patch"])
        if patch is None:
            saved.pop("patch")
        else:
            st.session_state[keys.PATCH] = patch


def follow_grid(layout) -> None:
    """Keep the selected patch on the same place of the image when the patch grid changes.

    The selection is a raster index of the grid it was picked on (``st.session_state[keys.PATCH]``); a new
    resolution or model gives another grid, where the same number is another place. Map it to the patch
    that holds the old patch's centre (:meth:`vitviz.layout.TokenLayout.patch_from`); call once per run,
    before a page reads the selection.
    """
    grid = tuple(layout.grid_size)
    old, patch = st.session_state.get(PATCH_GRID), st.session_state.get(keys.PATCH)
    st.session_state[PATCH_GRID] = grid
    if patch is None or old is None or tuple(old) == grid:
        if patch is not None and not 0 <= patch < layout.num_patches:  # a number from a link for another grid
            st.session_state[keys.PATCH] = None
            st.session_state.setdefault(SAVED, {}).pop("patch", None)
        return
    mapped = layout.patch_from(patch, tuple(old))
    st.session_state[keys.PATCH] = mapped
    st.session_state[STALE_PATCH] = patch
    st.session_state.setdefault(SAVED, {})["patch"] = str(mapped)
    st.query_params["patch"] = str(mapped)


def saved_view() -> dict[str, str]:
    """The view as last written (URL keys, text values)."""
    return dict(st.session_state.get(SAVED, {}))


# ---- uploads kept by content hash -------------------------------------------------------------------
IMAGES_PARAM = "img"
CURRENT_PARAM = "image"
HASH_CHARS = 32  # 128 bits of SHA-256: the link is the only way to an upload; nobody guesses it
DEFAULT_KEEP_MB = 256


@st.cache_resource(show_spinner=False)
def kept_uploads() -> ByteLRU:
    """Uploads by content hash, shared by the server's sessions but reachable only through a link that names
    the hash (``?img=...``), so a reload or a shared link brings an image back; least recently used ones go
    first beyond ``VITVIZ_KEEP_MB`` (default 256 MB)."""
    budget = whole(os.environ.get("VITVIZ_KEEP_MB", DEFAULT_KEEP_MB), DEFAULT_KEEP_MB)
    return ByteLRU(max(1, budget) << 20)


def content_name(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def keep_images(store: dict[str, bytes]) -> list[str]:
    """Bring back the uploads a link names when this session holds none (F5, a shared link), keep every upload
    of the session server-side, and name them in the URL. Returns the sentences for uploads that are gone."""
    kept, gone = kept_uploads(), []
    wanted = [h for h in st.query_params.get(IMAGES_PARAM, "").split(",") if h]
    if not store and wanted and not st.session_state.get(keys.PERSIST_RESTORED):
        for h in wanted:
            held = kept.get(h)
            if held is None:
                gone.append(f"An image of this link ({h[:8]}…) is no longer kept on this server; upload it again.")
            else:
                store[held[0]] = held[1]
        current = st.query_params.get(CURRENT_PARAM)
        if current in store:
            choose(keys.CURRENT, current)
    st.session_state[keys.PERSIST_RESTORED] = True
    names = []
    for name, data in store.items():
        h = content_name(data)
        if h not in kept:
            kept.put(h, (name, data))
        names.append(h)
    text = ",".join(names)
    if text and st.query_params.get(IMAGES_PARAM) != text:
        st.query_params[IMAGES_PARAM] = text
    elif not text and IMAGES_PARAM in st.query_params:
        del st.query_params[IMAGES_PARAM]
    return gone


def remember_current(name: str) -> None:
    """The current image's name in the URL (it comes back after F5 when it is an upload or a sample)."""
    if st.query_params.get(CURRENT_PARAM) != name:
        st.query_params[CURRENT_PARAM] = name


def uploads_box(store: dict[str, bytes], in_uploader: set[str] = frozenset()) -> str | None:
    """What is loaded and not listed by the uploader itself (``in_uploader``: it is empty after a page switch or F5),
    each with a × that removes it. Returns the removed name, if any."""
    removed = None
    for name, data in list(store.items()):
        if name in in_uploader:
            continue
        left, right = st.sidebar.columns([5, 1], vertical_alignment="center")
        # A Material icon (Streamlit's own font): the 📄 emoji was a missing glyph where no emoji font is installed.
        left.caption(f":material/image: {name} · {file_size(len(data))}")
        if right.button("×", key=f"remove_{content_name(data)}", help=f"Remove {name}"):
            store.pop(name)
            removed = name
    return removed


def linked_samples(samples: list[str]) -> list[str]:
    """The sample photo a link names as the current image, so a fresh session shows it."""
    current = st.query_params.get(CURRENT_PARAM)
    return [current] if current in samples else []


# ---- model and resolution ---------------------------------------------------------------------------
MODEL_PARAM, SIZE_PARAM = "model", "res"


def seed_model(bundled: str, by_name: str) -> None:
    """On a session's first run, seed the sidebar's model box from a link's ``model`` and ``res`` (the widgets read
    their kept values, :mod:`ui.widgets`)."""
    if st.session_state.get(keys.PERSIST_MODEL_SEEDED):
        return
    st.session_state[keys.PERSIST_MODEL_SEEDED] = True
    name = st.query_params.get(MODEL_PARAM)
    if name and name != bundled and not name.startswith(("hf:", "/", ".")):
        choose(keys.MODEL_CHOICE, by_name)
        choose(keys.TIMM_QUERY, name)
        choose(keys.TIMM_NAME, name)
    size = st.query_params.get(SIZE_PARAM, "")
    if size.isdigit():
        choose(keys.IMG_SIZE, int(size))


def remember_model(name: str, img_size: int | None) -> None:
    """The model shown and its input resolution in the URL (0: the model's own)."""
    params = {MODEL_PARAM: name, SIZE_PARAM: str(img_size or 0)}
    if any(st.query_params.get(k) != v for k, v in params.items()):
        st.query_params.update(params)
