"""Painted concepts in the app: the patches painted per image (session state), the click-to-paint picker, the fitted
concept probe kept for the session (the Concepts page fits it, the Attribution page explains it)."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st
from streamlit_image_coordinates import streamlit_image_coordinates

from vitviz.probes.concepts import PaintedImages, fit_concept, patch_rectangle
from vitviz.probes.figures import painted_image

from . import keys
from .cache import model_run
from .display import CLICK_SCALE

PAINT = "concept_paint"  # {(image sha256, gh, gw): {"concept": set, "not": set}} of raster patch indices (0-based)
FITTED = "concept_fitted"  # (key, ConceptProbe) of the last fit
BRUSHES = {"concept": "concept", "not concept": "not"}


def painting(image_sha: str, grid: tuple[int, int]) -> dict:
    """The patches painted on one image for one grid: ``{"concept": set, "not": set}`` (created empty)."""
    return st.session_state.setdefault(PAINT, {}).setdefault((image_sha, *grid), {"concept": set(), "not": set()})


def paint_picker(image, image_sha: str, layout, brush: str, key: str) -> None:
    """The model-input ``image`` at column width with its painted patches. A click toggles the patch under it in
    ``brush`` (``"concept"`` or ``"not"``); a drag paints every patch of the rectangle it spans with ``brush``. A
    painted patch leaves the other brush's set.

    The gesture is read from the widget's state before the picture is drawn, so the run it starts draws the new
    painting (one run per gesture). The widget keeps only its last gesture: two made while a run is still going
    count as one (hence the rectangle: one gesture for many patches)."""
    grid = tuple(layout.grid_size)
    paint = painting(image_sha, grid)
    widget = f"{key}_{image_sha[:12]}"
    last = f"{widget}_last"  # per image: another image's picker keeps its last gesture, which must not be replayed
    gesture = st.session_state.get(widget)
    if gesture and gesture.get("unix_time") != st.session_state.get(last):
        st.session_state[last] = gesture.get("unix_time")
        scale = gesture["width"] / image.width
        start, end = (layout.patch_at(gesture[f"x{i}"], gesture[f"y{i}"], scale) for i in (1, 2))
        patches = set(patch_rectangle(start, end, grid))
        other = "not" if brush == "concept" else "concept"
        if len(patches) == 1:
            paint[brush].symmetric_difference_update(patches)
        else:
            paint[brush].update(patches)
        paint[other].difference_update(patches)
    streamlit_image_coordinates(painted_image(image, paint["concept"], paint["not"], grid, CLICK_SCALE), key=widget,
                                image_format="JPEG", jpeg_quality=85, width="stretch", click_and_drag=True)


def painted_set(images, grid: tuple[int, int]) -> tuple[PaintedImages, tuple]:
    """The session's images with their paintings (:class:`PaintedImages`, masks (gh, gw) bool or None) and a key of
    what was painted."""
    import numpy as np

    concept, not_concept, key = [], [], []
    for im in images:
        paint = painting(im.sha256, grid)
        masks = []
        for kind in ("concept", "not"):
            if paint[kind]:
                m = np.zeros(grid[0] * grid[1], bool)
                m[sorted(paint[kind])] = True
                masks.append(m.reshape(grid))
            else:
                masks.append(None)
        concept.append(masks[0])
        not_concept.append(masks[1])
        key.append((im.sha256, tuple(sorted(paint["concept"])), tuple(sorted(paint["not"]))))
    return PaintedImages.of(list(images), concept, not_concept, names=[im.name for im in images]), tuple(key)


def fit(ctx, backbone, painted: PaintedImages, key: tuple, progress):
    """Fit the concept probes of every layer on the sidebar's backbone (a Lens) and keep them for the session."""
    with model_run():
        result = fit_concept(backbone, painted, progress=progress)
    st.session_state[FITTED] = (("concept", backbone_spec(ctx), key), result)
    return result


def backbone_spec(ctx):
    """The sidebar's model without a probe head: concepts are probed on the backbone."""
    return replace(ctx.spec, head=None)


def fitted(ctx, key: tuple | None = None):
    """The session's fitted concept probe for the sidebar's backbone (and, with ``key``, for exactly these
    paintings), or None."""
    kept = st.session_state.get(FITTED)
    if kept is None:
        return None
    (_, spec, painted), result = kept
    if spec != backbone_spec(ctx) or (key is not None and painted != key):
        return None
    return result


def concept_target_picker(ctx, container, key: str):
    """On the Attribution page: when a concept has been painted and fitted for the sidebar's backbone, a choice
    between the model's own target and the concept's logit at a layer; returns the
    :class:`vitviz.probes.concepts.ConceptTarget`, or None for the model's own target."""
    from vitviz.probes.concepts import ConceptTarget

    concept = fitted(ctx)
    if concept is None:
        return None
    with container:
        if st.radio("Explain", ["the model's output", "the painted concept"], key=f"{key}_what",
                    horizontal=True) == "the painted concept":
            top = min(concept.num_layers, ctx.lens.num_layers)  # a probe head ends early
            default = min(concept.readable_from(0.9) or top, top)
            layer = st.slider("Concept's layer (1-based)", 1, top, default, key=f"{key}_layer",
                              help="The patch probe of this layer; its logit is explained.")
            patch = st.session_state.get(keys.PATCH)  # the patch picked on any page (0-based raster index)
            where = st.radio("Where", ["summed over the patches", "at the selected patch"], key=f"{key}_where",
                             horizontal=True, disabled=patch is None,
                             help="The selected patch is the one clicked on the heads, rollout or anatomy page"
                                  + ("" if patch is None else f" (now patch {patch})") + ".")
            at_patch = where == "at the selected patch" and patch is not None
            return ConceptTarget(concept, layer, patch=int(patch) if at_patch else None)
    return None


def concept_refusals(concept, lens, methods: list[str]) -> dict[str, str]:
    """Method -> the registry's sentence saying why it cannot explain ``concept`` on ``lens``'s model (LeGrad;
    Grad-CAM before the last layer), for ``methods``."""
    from vitviz.explainers import registered

    found = registered()
    return {m: why for m in methods if (why := found[m].why_not_target(lens, concept))}
