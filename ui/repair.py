"""The "Repair" choice shared by the heads, rollout and attribution pages, and its before / after view.

A page calls :func:`repair_view` once, below its own maps, with a function giving its maps from one run
(:class:`Side`): the maps of the page's current settings as the model is and with the repair run in the forward
(:mod:`vitviz.analyses.registers`), side by side on one colour scale, the token norms and the output change.
The choice is kept in the session and the URL (``?repair=``), like the display choices, so it holds across
pages and reloads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Collection

import numpy as np
import pandas as pd
import streamlit as st

from vitviz.errors import VitvizError
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.runs.registers_run import analyse_repaired
from vitviz.analyses.registers import REPAIRS, Repair, TestTimeRegister, check_register, compare_outputs, register_from_json
from vitviz.runs.registers_run import repair_faithfulness
from vitviz.figures.core import panel_width
from vitviz.figures.registers_figures import (TABLE_FORMATS, maps_figure, norm_ratio_figure, output_change_table,
                                              repair_faithfulness_table)

from vitviz.figures.faithfulness_figures import method_label
from vitviz.perturbation.protocols import REPLACEMENT_TEXT

from .cache import _model_run, cached_model, store
from .image_faithfulness import FaithfulnessSettings, faithfulness_key, image_faithfulness
from .progress import cached
from .words import counted
from .charts import file_stem, show_chart
from .display import display_in_use
from .downloads import download_row

REPAIR_KEY, URL_PARAM = "repair_choice", "repair"
NEURONS_KEY = "register_neurons"  # spec -> (neurons ((layer 0-based, unit), ...), where they came from)
INIT_KEY = "repair_init"
NORMS_AXES = ("norms_before[layer - 1, token], norms_after[layer - 1, token]: 0-based arrays, layers 1-based on screen; "
              "tokens: prefix tokens first (token_layout_after lists them), then patches in raster order")


@dataclass
class Side:
    """One side of the comparison: the image's result, the repair run in it (``Repair()`` before) and its ``edit=``
    (None before), for pages whose maps need a model run of their own (attribution); ``compared``: the repair
    chosen (the same on both sides)."""

    result: ImageAnalyses
    repair: Repair
    edit: dict | None
    compared: Repair


def offer_register(spec, neurons, source: str) -> None:
    """Make a neuron set the pages' test-time register for model ``spec`` (the registers page's search, an upload)."""
    st.session_state.setdefault(NEURONS_KEY, {})[spec] = (tuple((int(a), int(b)) for a, b in neurons), source)


def _remember() -> None:
    st.session_state[f"kept_{REPAIR_KEY}"] = st.session_state[REPAIR_KEY]


def repair_choice(ctx) -> Repair | None:
    """The "Repair" widget (kept across pages and in the URL); the repair to run, or None for "none" or one that
    cannot run yet (the sentence is shown)."""
    names = ["none", "sinks", "register"] + (["trained"] if any(n.startswith("reg") for n in ctx.result.layout.prefix_tokens)
                                             else [])
    kept = st.session_state.get(f"kept_{REPAIR_KEY}", st.query_params.get(URL_PARAM, "none"))
    st.session_state[REPAIR_KEY] = kept if kept in names else "none"
    kind = st.selectbox("Repair (before / after)", names, format_func=REPAIRS.get, key=REPAIR_KEY, on_change=_remember,
                        help="sink masking: each layer's patch sinks dropped as keys, rows renormalised. Test-time "
                             "register: the register neurons (from the Registers page's search or a registers.json) "
                             "moved onto one extra token (Jiang et al. 2025). Trained registers dropped: the model's "
                             "own register tokens dropped as keys in every layer.")
    if kind == "none" and URL_PARAM in st.query_params:
        del st.query_params[URL_PARAM]
    elif kind != "none" and st.query_params.get(URL_PARAM) != kind:
        st.query_params[URL_PARAM] = kind
    if kind == "none":
        return None
    if kind != "register":
        repair = Repair(kind)
    else:
        register = _register(ctx)
        if register is None:
            return None
        repair = Repair("register", register)
    why = repair.why_not(ctx.lens.model, ctx.result.layout)
    if why:
        st.info(why)
        return None
    return repair


def _register(ctx) -> TestTimeRegister | None:
    """The session's neuron set for this model, or one read from an uploaded registers.json."""
    held = st.session_state.get(NEURONS_KEY, {}).get(ctx.spec)
    upload = st.file_uploader("registers.json (from `python -m vitviz registers` or the Registers page)", type=["json"],
                              key="repair_registers_json",
                              help="Without one, search this model's register neurons on the Registers page first.")
    if upload is not None:
        try:
            data = json.loads(upload.getvalue())
            register = register_from_json(data if isinstance(data, dict) else {})
            check_register(ctx.lens.model, register, ctx.result.layout)
        except (UnicodeDecodeError, json.JSONDecodeError, VitvizError) as exc:
            st.error(f"{upload.name}: {exc} (give the registers.json written for this model).")
            return None
        offer_register(ctx.spec, register.neurons, upload.name)
        held = st.session_state[NEURONS_KEY][ctx.spec]
    if held is None:
        st.info("No register neurons for this model yet: search them on the Registers page (they carry over), or "
                "upload a registers.json above.")
        return None
    init = st.radio("The extra token starts as", ["zero", "mean"], horizontal=True, key=INIT_KEY,
                    help="zero: as Jiang et al.'s code; mean: the mean of the patch tokens entering block 1")
    st.caption(f"Test-time register: {counted(len(held[0]), 'neuron')} from {held[1]}.")
    return TestTimeRegister(held[0], init)


def _repaired(ctx, repair: Repair) -> tuple[ImageAnalyses, object]:
    """The current image's result with ``repair`` run in the forward, and the output change (cached per repair)."""
    def compute():
        loaded = cached_model(ctx.spec)
        after = analyse_repaired(loaded, [ctx.image.image], repair, [ctx.result.sinks]).image(0)
        param = next(loaded.model.parameters())
        x = preprocess([ctx.image.image], loaded.data_config).tensor.to(param.device, param.dtype)
        edit = repair.edit(loaded.model, loaded.layout, [ctx.result.sinks], param.device)
        return after, compare_outputs(loaded.model, x, edit)

    return store().get_or_compute(("repair", ctx.spec, ctx.image.sha256, repair),
                                  _model_run(f"Running with {repair.name} ...", compute))


def repair_view(ctx, key: str, maps_of: Callable[[Side], dict[str, np.ndarray]], *, what: str,
                value_name: str = "attention", signed: Collection[str] = (),
                padding: Collection[int] | None = None) -> None:
    """The page's "Repair" choice and, when one is chosen, its maps before and after side by side.

    Args:
        key: the page's name for its figures and downloads.
        maps_of: one run -> {title: (gh, gw) map} with the page's current settings.
        what: what the maps are, for the title (e.g. "Rollout of the CLS, layers 1-12").
        value_name: the colour bar's unit.
        signed: the titles of the maps that are signed (relevance): a diverging scale centred on 0; the others
            (attention, LeGrad, Grad-CAM) a sequential one from 0, as on every other page.
        padding: the padding patches to hatch and keep out of the colour scale (0-based raster; the page's
            ``Display.padding``, empty when the Display switch is off); None: the session's Display choice
            (:func:`ui.display.display_in_use`).
    """
    st.divider()
    st.subheader("Repair: before and after")
    left, _ = st.columns([1, 2])
    with left:
        repair = repair_choice(ctx)
    if repair is None:
        st.caption("Choose a repair to see these maps with it run in the forward, beside the maps as they are.")
        return
    after, change = _repaired(ctx, repair)
    layout = ctx.result.layout
    before_maps = maps_of(Side(ctx.result, Repair(), None, repair))
    device = next(ctx.lens.model.parameters()).device
    after_maps = maps_of(Side(after, repair, repair.edit(ctx.lens.model, layout, [ctx.result.sinks], device), repair))
    marked = ctx.result.sinks.patch_sinks(layout) if repair.kind == "sinks" else None
    padding = np.asarray(display_in_use().padding if padding is None else tuple(padding), dtype=int)
    stem = file_stem(key, "repair", repair.kind, ctx.image.name)
    title = f"{what}: before and after {repair.name}"
    # Maps of one kind (attention) share one figure and one scale. Attribution maps differ in unit per method: each
    # method's pair gets its own figure and scale, signed ones (relevance) diverging around 0, the others sequential
    # from 0, as the method is drawn on every other page.
    groups = [list(before_maps)] if not signed and len(before_maps) > 1 else [[name] for name in before_maps]
    for i, names in enumerate(groups):
        is_signed = names[0] in signed
        titles = [t for name in names for t in (f"{name}: before", f"{name}: after")]
        tiles = np.stack([m for name in names for m in (before_maps[name], after_maps[name])])
        fig, caption = maps_figure(ctx.result.model_input, tiles, titles, layout,
                                   title if len(groups) == 1 else f"{names[0]}: before and after {repair.name}",
                                   value_name=value_name, columns=2, tile_px=300, marked=marked, signed=is_signed,
                                   padding=padding)
        # At the tiles' own width: at full column width the colour bar sat ~250 px right of the tiles (1440x900).
        show_chart(fig, f"{key}_repair_maps" + (f"_{i}" if i else ""), stem, width=panel_width(fig))
        st.caption(caption + " Before and after share one colour scale." + (
            " Crossed: the patch sinks the repair drops (they set no colour limit)." if marked is not None else ""))
    show_chart(norm_ratio_figure(ctx.result.token_norms, layout, after.token_norms, after.layout, repair.name),
               f"{key}_repair_norms", file_stem(key, "repair_norms", repair.kind, ctx.image.name))
    st.markdown("**Output change** (this image, after vs before)")
    show_table(output_change_table(change, [ctx.image.name]))
    st.caption("Pooled cosine: the cosine of the pooled vectors (the head's input) with and without the repair; for "
               "classifiers, whether the top-1 class stays and how its logit moved.")
    download_row(stem, {f"map{i}_before": before_maps[name] for i, name in enumerate(before_maps)}
                 | {f"map{i}_after": after_maps[name] for i, name in enumerate(after_maps)}
                 | {"norms_before": ctx.result.token_norms, "norms_after": after.token_norms},
                 {"image": ctx.image.name, "model": ctx.loaded.card()["spec"], "repair": repair.to_dict(),
                  "maps": what, "map_names": list(before_maps), "token_layout_after": after.layout.to_dict(),
                  "axes": NORMS_AXES, "output_change": change.to_dict(),
                  "padding_patches (0-based, hatched, no colour limit)": padding.tolist()})
    faithfulness_view(ctx, repair, key)


def show_table(table: pd.DataFrame, **kwargs) -> None:
    """A registers table with its number formats (:data:`vitviz.figures.registers_figures.TABLE_FORMATS`)."""
    st.dataframe(table, hide_index=True, column_config={c: st.column_config.NumberColumn(format=f)
                                                        for c, f in TABLE_FORMATS.items() if c in table}, **kwargs)


def faithfulness_view(ctx, repair: Repair, key: str) -> None:
    """Deletion / insertion AUC of the Faithfulness page's default methods (AttnLRP where the family allows, rollout)
    before and after ``repair``, each beside its random band, computed on demand
    (:func:`vitviz.runs.registers_run.repair_faithfulness`). "Before" is the Faithfulness page's own test with its
    default settings (:func:`ui.image_faithfulness.image_faithfulness`, the same cache entry): after that page, only
    the "after" runs."""
    settings = FaithfulnessSettings.defaults(ctx)
    before_key = faithfulness_key(ctx, settings)
    store_key = ("repair_faithfulness", ctx.spec, ctx.image.sha256, repair, before_key)
    slot = st.empty()
    ran = cached(before_key) is not None
    forwards = settings.forwards() * (0 if ran else 1) + _after_forwards(settings)
    if store_key not in store() and not slot.button(
            f"Faithfulness before and after {repair.name} ({', '.join(method_label(m) for m in settings.methods)}; "
            f"about {forwards} forwards" + ("; the Faithfulness page's 'before' is reused)" if ran else ")"),
            key=f"{key}_faithfulness_run"):
        return
    slot.empty()

    # Each of these holds a run slot of its own while it computes (and is cached): not inside the slot below.
    before, _ = image_faithfulness(ctx, settings)
    after, _ = _repaired(ctx, repair)
    result = store().get_or_compute(store_key, _model_run(
        f"Deletion and insertion after {repair.name} ...",
        lambda: repair_faithfulness(cached_model(ctx.spec), ctx.image.image, repair, sinks=[ctx.result.sinks],
                                    target=settings.target, before=before, after=after)))
    st.markdown(f"**Faithfulness before and after {repair.name}** (this image)")
    show_table(repair_faithfulness_table(result.table()))
    st.caption(f"Score: {result.before.score}. The Faithfulness page's test with its default settings: deletion "
               f"removes patches most relevant first (lower is better), insertion adds them to a blank input (higher is "
               f"better), removed patches become {REPLACEMENT_TEXT[settings.replacement]}, AUC over 0–100 % of the "
               "patches in steps of 10 %; the 'before' rows are that page's numbers. The 'after' maps are scored with "
               "the repair run in every forward (sink masking drops the sinks found on the unperturbed image). A "
               "verdict is 'better'/'worse' only outside the random maps' mean ± 2 s.d.")


def _after_forwards(settings: FaithfulnessSettings) -> int:
    """Forwards of the "after" side: deletion and insertion (no LeRF) of every map at each inner step, and the ends."""
    return (settings.forwards() - 2) * 2 // 3 + 2
