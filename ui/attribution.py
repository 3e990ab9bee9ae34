"""The attribution maps' cached computation and the widgets around them, shared by the Attribution page and the
attribution panels of the rollout and heads pages: one model run per (image, methods, target), kept in the
session-shared store so a rerun only redraws, and one way of choosing the target and stating the scale."""
from __future__ import annotations

import hashlib

import streamlit as st

from ui.cache import cached_lens, model_run
from ui.charts import file_stem, show_chart
from ui.display import display_in_use
from ui.downloads import download_row
from ui.progress import with_progress
from vitviz.adapters import Rules, editing
from vitviz.errors import VitvizError
from vitviz.explainers import Map, explain, methods as method_rows, registered
from vitviz.explainers.base import AttributionMethod, why_not_attribution
from vitviz.explainers.targets import Projection, default_target
from vitviz.lens import Lens
from vitviz.figures.attribution_figures import maps_figure
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.tokens import top_classes

HEADLESS_TARGET = ("**Target**: this model has no classifier head; the pooled vector's projection on its own "
                   "unperturbed direction, s(x) = ⟨p(x), p(x₀)⟩ / ‖p(x₀)‖, is explained.")


def attributions(ctx, methods: list[str], target_class: int | None, side=None, concept=None) -> list[Map]:
    """Each method's :class:`vitviz.explainers.Map` of the current image (one backward each);
    with ``side`` (:class:`ui.repair.Side`), its repair runs in every forward (:func:`vitviz.adapters.editing`); with
    ``concept`` (a :class:`vitviz.probes.concepts.ConceptTarget`), that painted concept is explained instead."""
    repair = None if side is None or side.edit is None else side.repair
    what = target_class if concept is None else (
        "concept", concept.layer, concept.patch, hashlib.sha256(concept.probe.weight.tobytes()).hexdigest())
    key = ("attribution", ctx.spec, ctx.image.sha256, tuple(methods), what) + ((repair,) if repair else ())

    def compute(progress):
        lens = cached_lens(ctx.spec)
        x = preprocess([ctx.image.image], lens.loaded.data_config).tensor
        target = concept or default_target(lens.model, target_class)
        results = []
        with model_run(), editing(None if repair is None else side.edit):
            for i, method in enumerate(methods):
                progress(i, len(methods))
                results.append(explain(lens, x, method, target))
        return results

    return with_progress(key, "Attribution: method", compute)


def repair_maps_of(ctx, methods: list[str], target_class: int | None):
    """For the repair's before and after (:func:`ui.repair.repair_view`): one side's patch maps of ``methods`` by
    label. Under a test-time register the methods that read patch tokens by position (LeGrad, Grad-CAM) are left out,
    and the caption says so."""
    def maps_of(side) -> dict:
        kept = [m for m in methods if side.compared.kind != "register" or registered()[m].pixels]
        if side.edit is not None and len(kept) < len(methods):
            st.caption("LeGrad and Grad-CAM read the patch tokens by position and do not know the extra token yet: "
                       "they are left out under the test-time register.")
        return {label(a.method): a.patches[0] for a in attributions(ctx, kept, target_class, side)}
    return maps_of


def attribution_methods(lens: Lens) -> tuple[list[str], dict[str, str]]:
    """(the attribution methods that apply to ``lens``'s model, method -> the sentence refusing each other one): those
    of :func:`vitviz.methods` whose rules or per-layer gradients act in the forward, in the registry's order except
    that the plain gradient (Gradient × Input: the model's own rules), the baseline the others are read against,
    comes last."""
    found = registered()
    rows = sorted((r for r in method_rows(lens) if isinstance(found[r["name"]], AttributionMethod)),
                  key=lambda r: getattr(found[r["name"]], "rules", None) is Rules)
    return [r["name"] for r in rows if r["why_not"] is None], {r["name"]: r["why_not"] for r in rows if r["why_not"]}


def keep_available(key: str, available: list[str]) -> None:
    """Drop from the widget state under ``key`` the methods chosen for another model that this one refuses."""
    chosen = st.session_state.get(key)
    if isinstance(chosen, list) and any(m not in available for m in chosen):
        st.session_state[key] = [m for m in chosen if m in available]
    elif isinstance(chosen, str) and chosen not in available:
        del st.session_state[key]


def target_picker(ctx, container, key: str, say_headless: bool = True) -> int | None:
    """The class whose logit is explained, picked in ``container`` among the top 10 (default the top-1), or None
    for a headless model (the projection of its pooled vector; ``container`` says so unless ``say_headless`` is
    False)."""
    if not ctx.lens.has_head:
        if say_headless:
            container.markdown(HEADLESS_TARGET)
        return None
    top = top_classes(ctx.result.logits, k=10, labels=ctx.lens.class_labels)
    label = container.selectbox("Target class (logit)", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key=key)
    return int(label.split(":")[0])


def target_title(target) -> str:
    """The target in words, for titles and captions (:meth:`vitviz.explainers.targets.Target.text` names the vector
    as the code does, e.g. ``forward_head(pre_logits=True)``: for downloads and the docs, not the screen)."""
    if isinstance(target, Projection):
        return "projection of the model's pooled output vector on its direction for this image"
    return target.text()


def label(method: str) -> str:
    """The map method's name as the registry (:mod:`vitviz.explainers`) gives it to every reader (``"Grad-CAM"``)."""
    return registered()[method].label


def scale_caption(target_text: str, methods: list[str]) -> str:
    """What the maps' colours mean, under every attribution figure."""
    rule = registered()  # each method's colour rule (signed: diverging around 0)
    signed = [label(m) for m in methods if rule[m].signed]
    unsigned = [label(m) for m in methods if not rule[m].signed]
    return (f"Target: {target_text}. Drawn over the model input with the Display box's overlay and opacity. "
            + (f"Signed maps ({', '.join(signed)}) use a diverging scale centred on 0 with symmetric limits at the "
               "99th percentile of |relevance| (red raises the target, blue lowers it, 0 lets the photo through). "
               if signed else "")
            + (f"{' and '.join(unsigned)} {'is' if len(unsigned) == 1 else 'are'} non-negative (the Display box's "
               "colour map, from 0). " if unsigned else "")
            + ("Each map has its own scale: the methods' units differ." if len(methods) > 1 else ""))


def overlay_choices(display) -> dict:
    """The Display's overlay choices as :func:`vitviz.figures.attribution_figures.maps_figure` takes them: attribution maps
    are drawn over the photo as the attention maps are (the colour map only for the non-negative methods)."""
    return {"cmap": display.cmap, "style": display.style, "opacity": display.opacity, "smooth": display.smooth}


def attribution_panel(ctx, key: str, controls=None, display=None) -> None:
    """One attribution method's patch map of the current image, through the same cached computation, target and
    figure as the Attribution page, for a page that shows it beside its own maps (rollout, heads). Refusals are
    the model's sentences.

    Args:
        key: prefix of the widgets' keys.
        controls: the container of the method and target widgets (default: above the map); the map, its
            caption and downloads go where the call is made.
        display: the page's :class:`ui.display.Display` (default: the choices last made on a map page).
    """
    if why := why_not_attribution(ctx.lens.model):
        st.info(why)
        return
    available, refused = attribution_methods(ctx.lens)
    keep_available(f"{key}_method", available)
    c1, c2 = (st if controls is None else controls).columns(2)
    method = c1.selectbox("Attribution method", available, format_func=label, key=f"{key}_method",
                          index=available.index("attnlrp") if "attnlrp" in available else 0)
    # The figure's title and the caption state a headless model's target; beside a map it needs no paragraph.
    target_class = target_picker(ctx, c2, f"{key}_target", say_headless=False)
    for sentence in refused.values():
        st.caption(sentence)
    try:
        result, = attributions(ctx, [method], target_class)
    except VitvizError as exc:  # a family whose forward the rules cannot reach yet
        st.info(str(exc))
        return
    text = target_title(result.target)
    stem = file_stem("attribution", ctx.image.name, method)
    display = display or display_in_use()
    show_chart(maps_figure(ctx.result.model_input, [result], pixels=False, target_text=target_title(result.target),
                           with_input=False,
                           wrap=56, plot_height=380, padding=display.padding, **overlay_choices(display)),
               f"{key}_fig", stem)
    st.caption(scale_caption(text, [method]) + " Patch map (relevance summed over each patch's pixels for AttnLRP, "
               "CP-LRP and Gradient × Input); computed when chosen and kept for this image, method and target.")
    download_row(stem, {f"attribution_{method.replace('-', '_')}": result.patches},
                 {"image": ctx.image.name, "model": ctx.loaded.card().get("spec"), "target": result.target.describe(),
                  "method": label(method), "conservation": result.conservation()})
