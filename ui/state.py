"""The sidebar every page shares, and the page's :class:`Context`: the model (a Lens), the image set, the current
image and its captured result.

Every page calls :func:`setup` first, so a page works the same run from ``app.py``'s
navigation or on its own (AppTest's ``switch_page`` runs page files without app.py).
The sidebar's rooms: :mod:`ui.model_box` (which model), :mod:`ui.recovery` (a model that fails to load),
:mod:`ui.uploads` (the image set) and :mod:`ui.widgets` (widget values across page switches).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import streamlit as st

from vitviz.errors import ImageError
from vitviz.io.images import LoadedImage, mean_colour, model_view, visible_share
from vitviz.lens import Lens
from vitviz.sources.preprocess import padding_patches
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.sources.models import BUNDLED, LoadedModel, ModelSpec
from vitviz.settings import megabytes

from . import keys, persist
from .display import PADDING
from .cache import cached_image_result, operator_settings, store
from .model_box import TIMM_BY_NAME, sidebar_spec
from .recovery import load
from .uploads import ASSETS, SAMPLES, decode, padded, sidebar_images
from .widgets import kept_args

FRAMING_LABELS = {"crop": "crop centre (the model's own)", "pad": "resize whole image (pad)"}
# A visible share above this is a rounding-level crop, not worth a sentence.
FULL_VIEW = 0.99


@dataclass
class Context:
    """What a page needs: the model (a :class:`vitviz.Lens`), the current image and its captured result.

    ``image`` and ``images`` are framed for the model (see :func:`vitviz.io.images.frame_image`):
    with ``framing == "pad"`` their pixels are the padded square and their ``sha256`` keys say so, and
    ``padding`` lists the current image's patches that hold padding only (0-based raster order).
    """

    spec: ModelSpec
    lens: Lens
    image: LoadedImage
    result: ImageAnalyses
    images: list[LoadedImage]
    framing: str = "crop"
    padding: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    @property
    def loaded(self) -> LoadedModel:
        """The lens's loaded model, for what a Lens does not hand on (``data_config``, ``card()``, ``why_not``)."""
        return self.lens.loaded


def _framing_caption(image: LoadedImage, framing: str, data_config: dict) -> str | None:
    """A sentence when the model does not see the whole image (its centre crop) or sees it padded."""
    w, h = image.image.size
    share = visible_share((w, h), data_config)
    if framing == "pad" or share >= FULL_VIEW:
        return None
    seen_w, seen_h = model_view((w, h), data_config)
    return (f"{image.name}: the model sees {share:.0%} of this image, the centre {seen_w:.0f}x{seen_h:.0f} px "
            f"of {w}x{h} (its resize and centre crop). Choose \"{FRAMING_LABELS['pad']}\" under Framing "
            "to show it all.")


def _leave_legacy_navigation() -> None:
    """Rerun through app.py when Streamlit ran this page file by itself on a session's first run.

    Until some session's app.py has called ``st.navigation``, Streamlit treats the ``pages/`` folder
    as a v1 multipage app: a browser opening ``/rollout`` on a fresh server ran the page without
    app.py (lower-case legacy page list, narrow layout) and every later session stayed so until
    someone opened ``/``. Setting the flag the way ``st.navigation`` does and rerunning puts this
    session (and every later one) on app.py's pages, at the same URL. Only a session's first run
    is rerun: a later one may carry a button press that a rerun would drop (AppTest resets the
    flag before every run and then runs the page file directly).
    """
    from streamlit.runtime.pages_manager import PagesManager

    first_run = not st.session_state.get(keys.RAN)
    st.session_state[keys.RAN] = True
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if first_run:
            st.rerun()


def sample_set(ctx: Context) -> list[LoadedImage]:
    """Every bundled sample photo (assets/), framed as the sidebar frames its images."""
    images = [decode(name, (ASSETS / name).read_bytes()) for name in SAMPLES]
    if ctx.framing == "pad":
        fill = mean_colour(ctx.loaded.data_config)
        images = [padded(im, im.sha256, fill) for im in images]
    return images


def setup() -> Context | None:
    """Draw the shared sidebar; return the page context, or None (with a message) when there is no image."""
    _leave_legacy_navigation()
    persist.restore_params()  # a page switch starts with a clean URL: the session's view goes back into it
    st.sidebar.title("vitviz")
    persist.seed_model(BUNDLED, TIMM_BY_NAME)
    spec, lens = load(sidebar_spec())
    persist.remember_model(spec.name, spec.img_size)
    st.sidebar.caption(f"**{lens.label}** · {lens.device} · {str(lens.loaded.dtype).removeprefix('torch.')}")
    images = sidebar_images()
    if not images:
        st.info("Upload an image or pick a sample photo in the sidebar.")
        return None
    framing, current, images = _current_image(images, lens.loaded.data_config)
    try:
        result = cached_image_result(spec, current.sha256, current.image)
    except ImageError as exc:
        st.error(f"{current.name}: {exc.reason}.")
        return None
    finally:
        _cache_caption()
    persist.follow_grid(result.layout)
    padding = _padding(spec, current, lens.loaded, result.layout.grid_size)
    st.session_state[PADDING] = tuple(padding.tolist())
    return Context(spec=spec, lens=lens, image=current, images=images, framing=framing, result=result,
                   padding=padding)


def _current_image(images: list[LoadedImage], data_config: dict) -> tuple[str, LoadedImage, list[LoadedImage]]:
    """The Framing and Current image boxes: (framing, the current image, the image set), framed for the model."""
    framing = st.sidebar.radio("Framing", list(FRAMING_LABELS), format_func=FRAMING_LABELS.get,
                               help="The model sees a square. Crop: its own resize and centre crop (wide or tall "
                                    "images lose their sides). Pad: the whole image, padded to a square with the "
                                    "model's mean colour first.", **kept_args(keys.FRAMING, list(FRAMING_LABELS)))
    names = [im.name for im in images]  # (the newest upload is already chosen: ui.uploads)
    current = images[names.index(st.sidebar.selectbox("Current image", names, **kept_args(keys.CURRENT, names)))]
    persist.remember_current(current.name)
    caption = _framing_caption(current, framing, data_config)
    if framing == "pad":
        fill = mean_colour(data_config)
        images = [padded(im, im.sha256, fill) for im in images]
        current = images[names.index(current.name)]
    if caption:
        st.caption(caption)
    for note in current.notes:
        st.caption(f"{current.name}: {note}")
    return framing, current, images


def _padding(spec: ModelSpec, image: LoadedImage, loaded: LoadedModel, grid: tuple[int, int]) -> np.ndarray:
    """The padding patches of the current image as the model sees it (0-based raster; empty unless padded)."""
    if image.content_box is None:
        return np.zeros(0, dtype=int)
    return store().get_or_compute(("padding", spec, image.sha256, tuple(grid)), lambda: np.flatnonzero(
        padding_patches(image, loaded.data_config, tuple(grid))))


def view_applies(ctx: Context, view: str) -> None:
    """Stop the page with the model's one sentence when ``view`` (:data:`vitviz.adapters.VIEWS`) does not
    apply to it (its adapter's ``why_not``): every page says it the same way."""
    why = ctx.loaded.why_not(view)
    if why:
        st.info(why)
        st.stop()


def _cache_caption() -> None:
    cache, limits = store(), operator_settings()
    st.sidebar.caption(f"Memory cache: {megabytes(cache.used)} of {megabytes(cache.budget)} (VITVIZ_CACHE_MB) · "
                       f"one image's attention at most {megabytes(limits.attention_limit_bytes)}"
                       + (" · shared server" if limits.shared else ""))
