"""The image set: uploads kept in the session, the sample photos, each decoded once in the shared cache.

A page switch re-creates the sidebar's uploader empty; the session keeps every uploaded file's bytes
(:func:`image_store`), so a page switch forgets nothing and a click on a file's × forgets that file.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from vitviz.errors import VitvizError
from vitviz.io.images import LoadedImage, frame_image, load_image
from vitviz.settings import megabytes

from . import keys, persist
from .cache import operator_settings, store
from .widgets import choose, chosen, kept_args

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SAMPLES = sorted(p.name for p in ASSETS.glob("*.jpg"))
IMAGE_TYPES = ["jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif"]


def image_store() -> dict[str, bytes]:
    """Uploaded files by name, kept in the session so they survive page switches."""
    return st.session_state.setdefault(keys.IMAGE_STORE, {})


def _uploader_key() -> str:
    # Forgetting bumps the generation: a new key is a new, empty uploader in the browser too.
    generation = st.session_state.get(keys.UPLOADER_GENERATION, 0)
    return "uploads" if generation == 0 else f"uploads_{generation}"


def _mark_uploader_changed() -> None:
    st.session_state[keys.UPLOADER_CHANGED] = True


def _sync_uploads(store: dict[str, bytes]) -> None:
    """Make the store follow the uploader; the newest upload becomes the current image.

    A page switch re-creates the uploader empty, which must not forget anything; a click on a
    file's × changes the uploader (its ``on_change`` sets ``uploader_changed``), which must.
    """
    key = _uploader_key()
    seen: set[str] = st.session_state.setdefault(keys.UPLOADS_SEEN, set())  # file_ids a run has stored or refused
    # An upload made just before the user opens another page: on a busy server its run has not happened when the page
    # switch arrives, and the new page's uploader is another widget (Streamlit gives each page's widget its own
    # identity), so no widget hands the file over. Read before this page's uploader is drawn, the key still names the
    # uploader of the page left (when the browser sent its value with the switch); the server holds the file in any
    # case. Without this the photo was silently dropped (8 of 8 users uploading on a cold server's landing page).
    left_behind = [_Arrived(u.file_id, u.name, u.getvalue()) for u in (st.session_state.get(key) or [])
                   if u.file_id not in seen] + _unclaimed_images(seen)
    uploads = st.sidebar.file_uploader("Upload images", type=IMAGE_TYPES, accept_multiple_files=True, key=key,
                                       on_change=_mark_uploader_changed) or []
    held = {u.file_id: u for u in uploads}
    before: dict[str, str] = st.session_state.get(keys.UPLOADER_HELD, {})  # file_id -> name, last run
    page = _page_id()
    # A file gone from the uploader is a click on its × only when this is the uploader that held it: with a page
    # switch the previous page's uploader can fire its on_change in this page's first run (a busy server), and the
    # files it held are not in this page's (new, empty) uploader: removing them dropped a user's photo.
    same_uploader = st.session_state.get(keys.UPLOADER_PAGE) == page
    if st.session_state.pop(keys.UPLOADER_CHANGED, False) and same_uploader:
        for file_id in before.keys() - held.keys():
            store.pop(before[file_id], None)
    st.session_state[keys.UPLOADER_PAGE] = page
    refused: dict[str, str] = st.session_state.setdefault(keys.UPLOADS_REFUSED, {})  # file_id -> sentence
    for file_id in refused.keys() - held.keys():
        refused.pop(file_id)
    # (a file the upload watch's run already took arrives in the uploader later: it is not taken twice)
    arrived = [u for file_id, u in held.items() if file_id not in before and file_id not in seen]
    arrived += list({u.file_id: u for u in left_behind if u.file_id not in held}.values())
    for upload in arrived:
        file_id = upload.file_id
        seen.add(file_id)
        why = _upload_refusal(upload.name, upload.size, len(store))
        data = upload.getvalue() if why is None else b""
        if why is None:
            # Decoded before it is kept: a file that is not an image is never stored, named in the URL or listed,
            # and its sentence goes when the uploader lets go of it (its ×, a page switch, F5).
            try:
                decode(upload.name, data)
            except VitvizError as exc:
                why = str(exc)
        if why:
            refused[file_id] = why
            continue
        store[upload.name] = data
        # Chosen in the same breath as it is stored: a run can be stopped at any Streamlit call (a page switch's rerun
        # arriving on a busy server), and an upload stored by a run stopped before the Current image box was drawn
        # stayed in the set without becoming the current image.
        choose(keys.CURRENT, upload.name)
    for why in refused.values():
        st.error(why)
    st.session_state[keys.UPLOADER_HELD] = {file_id: u.name for file_id, u in held.items()}


def _page_id() -> str:
    """The page this run draws (Streamlit's script hash of it): each page's uploader is another widget."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.page_script_hash if ctx is not None else ""


@dataclass(frozen=True)
class _Arrived:
    """An uploaded image no uploader of this run holds (see :func:`_sync_uploads`), shaped as Streamlit's own."""

    file_id: str
    name: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def getvalue(self) -> bytes:
        return self.data


def _unclaimed_images(seen: set[str]) -> list[_Arrived]:
    """The image files this session has sent to the server (Streamlit keeps every upload of a session until the
    browser removes it) that no run has stored or refused (``seen``: their file ids). Only the sidebar's "Upload
    images" takes image files (the pages' uploaders take parquet, json, safetensors). Streamlit's in-memory file
    manager is the only one it ships; under another (or AppTest, without a runtime) this finds nothing."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():
        return []
    manager = Runtime.instance().uploaded_file_mgr
    storage = getattr(manager, "file_storage", None)
    if not isinstance(storage, dict) or ctx.session_id not in storage:
        return []
    waiting = [file_id for file_id in list(storage[ctx.session_id]) if file_id not in seen]
    records = manager.get_files(ctx.session_id, waiting)  # under the manager's lock
    return [_Arrived(r.file_id, r.name, r.data) for r in records
            if Path(r.name).suffix.lower().lstrip(".") in IMAGE_TYPES]


def upload_too_large(name: str, size: int) -> str | None:
    """The sentence refusing an upload over VITVIZ_UPLOAD_MB, or None: the browser's size check is not trusted."""
    limit = operator_settings().upload_bytes
    if size > limit:
        return (f"{name}: it is {megabytes(size)}, over this server's upload limit of "
                f"{megabytes(limit)} (VITVIZ_UPLOAD_MB); it was not read.")
    return None


def _upload_refusal(name: str, size: int, held: int) -> str | None:
    """Why an upload is not taken, or None."""
    limits = operator_settings()
    if too_large := upload_too_large(name, size):
        return too_large
    if limits.max_images is not None and held >= limits.max_images:
        return (f"{name}: not added: this server allows {limits.max_images} uploaded images per session "
                "(VITVIZ_MAX_IMAGES); remove one or use \"Forget uploaded images\" first.")
    return None


def _forget_uploads(store: dict[str, bytes]) -> None:
    store.clear()
    st.session_state[keys.UPLOADER_GENERATION] = st.session_state.get(keys.UPLOADER_GENERATION, 0) + 1
    st.session_state[keys.UPLOADER_HELD] = {}


UPLOAD_WATCH_EVERY_S = 3
# After a page switch, how many looks (one per run of the page or of the watch, the watch every few seconds) an upload
# begun on the page left has to land: counted in looks, not seconds, so that a page whose own run takes minutes on a
# busy server (eight users on two cores) does not use the window up before the watch has looked once.
UPLOAD_WATCH_LOOKS = 20  # about 60 s of watching once the page's run is done


def watch_uploads() -> None:
    """After each page switch, look every few seconds (:data:`UPLOAD_WATCH_LOOKS` times) for an image this session
    sent that no run has taken, and rerun the page when one has landed.

    On a busy server an upload's bytes can reach it after the user has opened another page: the browser then drops
    the upload's own rerun (its uploader is gone with the page left), the file lands in the server's storage, and no
    run would ever take it (on a cold server, 1 to 4 of eight users uploading on the landing page lost their photo;
    with a window of 60 s from the switch, 3 of 8 still did on a machine at load 29, their heads page's first run
    outlasting the window). A session's first page needs no watch: there the uploader that sent the file reruns the
    page itself."""
    page, previous = _page_id(), st.session_state.get(keys.UPLOAD_WATCH_PAGE)
    if previous != page:
        st.session_state[keys.UPLOAD_WATCH_PAGE] = page
        st.session_state[keys.UPLOAD_WATCH_LEFT] = UPLOAD_WATCH_LOOKS if previous is not None else 0
    if st.session_state.get(keys.UPLOAD_WATCH_LEFT, 0) > 0:
        _upload_watch()


@st.fragment(run_every=UPLOAD_WATCH_EVERY_S)
def _upload_watch() -> None:
    left = st.session_state.get(keys.UPLOAD_WATCH_LEFT, 0)
    if left <= 0:
        return  # the timer goes with the page's next full run
    st.session_state[keys.UPLOAD_WATCH_LEFT] = left - 1
    if _unclaimed_images(st.session_state.get(keys.UPLOADS_SEEN, set())):
        st.rerun(scope="app")  # the page's run takes it (_sync_uploads)


def _samples_picked() -> None:
    """The user chose the sample set (the sidebar's box). A call carrying the set already kept is no choice: on a busy
    server a page switch can replay the page left's widget values, whose callbacks then fire unchanged; taken for a
    choice, the default sample stayed in the set beside the user's upload (and stayed the current image)."""
    if keys.SAMPLE_PICKS in st.session_state and st.session_state[keys.SAMPLE_PICKS] == chosen(keys.SAMPLE_PICKS):
        return
    st.session_state.pop(keys.SAMPLES_BY_DEFAULT, None)
    if keys.SAMPLE_PICKS in st.session_state:  # (kept as every sidebar widget's value is: ui.widgets)
        choose(keys.SAMPLE_PICKS, st.session_state[keys.SAMPLE_PICKS])


def sidebar_images() -> list[LoadedImage]:
    """The decoded image set: uploads, then chosen samples."""
    store = image_store()
    _sync_uploads(store)
    watch_uploads()
    for gone in persist.keep_images(store):  # first: after F5 the list below then shows the images it brought back
        st.sidebar.warning(gone)
    # The uploader lists what it holds with its own ×; the box lists the rest (after a page switch or F5).
    if persist.uploads_box(store, set(st.session_state.get(keys.UPLOADER_HELD, {}).values())):
        persist.keep_images(store)  # the URL names what is left
    if keys.kept(keys.SAMPLE_PICKS) not in st.session_state:
        linked = persist.linked_samples(SAMPLES)
        choose(keys.SAMPLE_PICKS, linked or SAMPLES[:1])
        if not linked:
            st.session_state[keys.SAMPLES_BY_DEFAULT] = "shown"
    # The default sample is there so that a first visit shows something: once the user's own photos are in (uploaded,
    # or back from a link after F5) it would only swell the set (the Probes page sorted it into a group), and it comes
    # back when no upload is left; a sample the user chose (the box, the first visit's explanation, a link) stays.
    default = st.session_state.get(keys.SAMPLES_BY_DEFAULT)
    if default == "shown" and store:
        choose(keys.SAMPLE_PICKS, [])
        st.session_state[keys.SAMPLES_BY_DEFAULT] = "hidden"
    elif default == "hidden" and not store:
        choose(keys.SAMPLE_PICKS, SAMPLES[:1])
        st.session_state[keys.SAMPLES_BY_DEFAULT] = "shown"
    samples = st.sidebar.multiselect("Sample photos (assets/)", SAMPLES, **kept_args(keys.SAMPLE_PICKS, SAMPLES)
                                     | {"on_change": _samples_picked, "args": ()})
    images, problems = [], []
    for name, data in store.items():
        try:
            images.append(decode(name, data))
        except VitvizError as exc:
            problems.append(str(exc))
    images += [decode(name, (ASSETS / name).read_bytes()) for name in samples if name not in store]
    for problem in problems:
        st.error(problem)
    if store and st.sidebar.button("Forget uploaded images"):
        _forget_uploads(store)
        st.rerun()
    return images


def decode(name: str, data: bytes) -> LoadedImage:
    """Decoded once per file in the shared byte-bounded cache; decode errors are raised every time."""
    return store().get_or_compute(("decoded", name, hashlib.sha256(data).hexdigest()), lambda: load_image(data, name))


def padded(loaded: LoadedImage, sha256: str, fill: tuple[int, int, int]) -> LoadedImage:
    """Padding copies the full-resolution image: once per image and fill, not per rerun."""
    return store().get_or_compute(("padded", sha256, fill), lambda: frame_image(loaded, "pad", fill))
