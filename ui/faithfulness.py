"""The Faithfulness page's sections: a finished run over an image set (:func:`dataset_view`), and on this image the
settings (:func:`choose`), the perturbation test (:func:`perturbation_run`), the AUC table (:func:`auc_section`),
what the model saw (:func:`model_saw_section`) and each method's map beside its curves (:func:`maps_section`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from ui.cache import operator_settings, store
from ui.charts import file_stem, show_chart
from ui.display import display_controls, map_figure, panel_download
from ui.downloads import download_row
from ui.image_faithfulness import (FaithfulnessSettings, attribution_options, faithfulness_key, image_faithfulness,
                                   method_options)
from ui.navigation import concepts_link
from ui.progress import cached
from ui.uploads import upload_too_large
from ui.words import counted
from vitviz.analyses.flow import FLOW_DEFINITION
from vitviz.analyses.rollout import FUSIONS
from vitviz.analyses.tokens import top_classes
from vitviz.errors import VitvizError
from vitviz.explainers import registered
from vitviz.figures.faithfulness_figures import (curves_figure, dataset_figure, method_curve_figure, method_label,
                                                 method_unit)
from vitviz.perturbation.curves import (ORDERINGS, RANDOM_SEEDS, Faithfulness, FoldedSeeds, fold_random_seeds,
                                        qualify_best, to_rgb)
from vitviz.perturbation.curves import auc as auc_of
from vitviz.perturbation.protocols import REPLACEMENT_TEXT, REPLACEMENTS, protocol_text, step_inputs
from vitviz.perturbation.protocols import LABELS as PROTOCOL_LABELS
from vitviz.perturbation.stats import RESAMPLES, SEED, Interval, auc_path, read_auc_table, sentence, summarise
from vitviz.runs.faithfulness_run import DEFAULT_METHODS
from vitviz.sources.preprocess import preprocess


def dataset_view() -> None:
    """A finished `python -m vitviz faithfulness` run: mean AUC per method with its bootstrap interval beside the
    random band, and the paired per-image differences, in sentences."""
    st.caption("Reads the auc.parquet of `python -m vitviz faithfulness IMAGES --methods attnlrp,rollout,random --out "
               "DIR`. Intervals: percentile bootstrap over images (95 %, "
               f"{RESAMPLES:,} resamples, seed {SEED}); differences are paired by image.")
    files, local = st.columns(2)
    upload = files.file_uploader("Faithfulness table (auc.parquet)", type=["parquet"], key="faith_ds_upload")
    table, source = None, None
    try:
        if upload is not None:
            if too_large := upload_too_large(upload.name, upload.size):
                raise VitvizError(too_large)
            digest = hashlib.sha256(upload.getbuffer()).hexdigest()
            table = store().get_or_compute(("auc_table", digest), lambda: read_auc_table(upload.getvalue(), upload.name))
            source = upload.name
        elif not operator_settings().shared:  # a shared server reads no file by a path a browser user names
            typed = local.text_input("... or a run's --out folder or auc.parquet path on this machine",
                                     key="faith_ds_path", placeholder="faith/").strip()
            if typed:
                path = auc_path(typed)
                stamp = path.stat().st_mtime_ns if path.is_file() else None  # a rewritten table is read again
                table = store().get_or_compute(("auc_table", str(path), stamp), lambda: read_auc_table(path, typed))
                source = typed
    except VitvizError as exc:
        st.error(str(exc))
        return
    if table is None:
        st.info("Upload an auc.parquet, or type the --out folder of a finished run.")
        return
    summary = store().get_or_compute(("auc_summary", source, len(table), float(table["auc"].sum())),
                                     lambda: summarise(table))
    protocols = list(summary["protocols"])
    protocol = st.radio("Protocol", protocols, format_func=lambda p: PROTOCOL_LABELS.get(p, p), horizontal=True,
                        key="faith_ds_protocol")
    block = summary["protocols"][protocol]
    images = table["image"].nunique()
    show_chart(dataset_figure(block, PROTOCOL_LABELS.get(protocol, protocol)), "faith_ds_fig",
               file_stem("faithfulness_dataset", protocol, f"{images}images"))
    seeds = block["random_seeds"]
    if seeds:
        st.caption(f"Grey band: the random floor's mean AUC over the {counted(images, 'image')} for each of "
                   f"{counted(seeds['seeds'], 'seed')}, mean {seeds['mean']:.3f} ± 2 × "
                   f"{seeds['sd_over_seeds']:.3f} (s.d. over seeds). "
                   f"{'Lower' if block['better'] == 'lower' else 'Higher'} AUC is more faithful under this protocol.")
    rows = pd.DataFrame([{"method": method_label(r["method"]), "mean AUC": r["mean"], "95 % low": r["low"],
                          "95 % high": r["high"], "images": r["images"],
                          "against random": {"better": "better than random", "worse": "worse than random",
                                             "chance": "cannot be told from chance"}.get(r.get("vs_random"), "—")}
                         for r in block["methods"]])
    st.dataframe(rows, hide_index=True, key="faith_ds_table",
                 column_config={c: st.column_config.NumberColumn(format=AUC_FORMAT) for c in
                                ("mean AUC", "95 % low", "95 % high")})
    st.markdown("\n".join(f"- {sentence(method_label(r['method']), Interval(**r['minus_random']), protocol)}"
                          for r in block["methods"] if "minus_random" in r))
    st.subheader("Paired differences (per image, a − b)")
    pairs = pd.DataFrame([{"a": method_label(d["a"]), "b": method_label(d["b"]), "mean a − b": d["mean"],
                           "95 % low": d["low"], "95 % high": d["high"], "images": d["images"],
                           "verdict": f"{method_label(d['more_faithful'])} is more faithful" if d["more_faithful"]
                           else "cannot be told apart"}
                          for d in block["differences"]])
    if len(pairs):
        st.dataframe(pairs, hide_index=True, key="faith_ds_pairs",
                     column_config={c: st.column_config.NumberColumn(format="%+.3f") for c in
                                    ("mean a − b", "95 % low", "95 % high")}
                     | {"verdict": st.column_config.TextColumn(width="large")})
    st.caption("A difference is significant when its 95 % interval excludes 0. Few images give wide intervals: "
               "that is the answer, not a failure.")
    download_row(file_stem("faithfulness_dataset", protocol, f"{images}images"), rows, summary)


# The AUC table on screen: words for headers, three decimals like every AUC on the page, nothing cut at 1440 px
# (LeRF AUC, equal to insertion's up to rounding, stays in the CSV; the two verdicts against chance share a column).
AUC_FORMAT = "%.3f"
AUC_HEADERS = {"deletion_auc": "deletion AUC ↓", "insertion_auc": "insertion AUC ↑",
               "insertion_minus_deletion": "insertion − deletion ↑", "lerf_minus_morf": "LeRF − MoRF ↑"}
AUC_COLUMNS = {name: st.column_config.NumberColumn(format=AUC_FORMAT) for name in AUC_HEADERS.values()} | {
    "vs chance (del. / ins.)": st.column_config.TextColumn(
        help="Outside the random maps' mean ± 2 s.d.: better or worse; inside: chance. The random row: its s.d."),
    "marks": st.column_config.TextColumn(help="Best and worst method per metric; a best the random maps cannot tell "
                                              "from chance says so.")}


def screen_table(table: pd.DataFrame) -> pd.DataFrame:
    """The AUC table as the page shows it (the CSV download keeps every column under its data name)."""
    shown = table.rename(columns=AUC_HEADERS | {"reference": "marks"})
    if "vs chance: deletion" in shown:
        shown["vs chance (del. / ins.)"] = [
            f"{d} / {i}".replace(" s.d. / ± ", " / ± ") for d, i in zip(shown.pop("vs chance: deletion"),
                                                                     shown.pop("vs chance: insertion"))]
    return shown[["method", *AUC_HEADERS.values()]
                 + [c for c in ("vs chance (del. / ins.)", "marks") if c in shown]]



@dataclass
class FaithChoice:
    """What the perturbation test runs on this image: the maps' methods and settings, the protocol's replacement and
    the order of signed maps, the target class (None: the pre-logits cosine) and the number of steps."""

    methods: list[str]
    attributions: list[str]  # the registry's methods among the options (computed by vitviz.explain)
    fusion: str
    discard: float
    start: int  # rollout layers, 1-based, inclusive
    end: int
    flow_start: int  # attention-flow layers, 1-based, inclusive
    flow_end: int
    seed: int  # the first random seed
    replacement: str
    ordering: str
    target: int | None
    steps: int

    def settings(self) -> FaithfulnessSettings:
        """The choice as :class:`ui.image_faithfulness.FaithfulnessSettings` (0-based, end-exclusive layers): what
        the Registers' "before" asks for too, so both pages share one computation and one cache entry."""
        return FaithfulnessSettings(methods=tuple(self.methods), steps=self.steps, target=self.target,
                                    fusion=self.fusion, discard=self.discard, start=self.start - 1, end=self.end,
                                    flow_start=self.flow_start - 1, flow_end=self.flow_end, seed=self.seed,
                                    ordering=self.ordering, replacement=self.replacement)

    def key(self, ctx) -> tuple:
        """The run's key in the session-shared store: a rerun with the same choice computes nothing."""
        return faithfulness_key(ctx, self.settings())


def _score_text(ctx) -> str:
    return ("softmax probability of the target class" if ctx.loaded.has_head else
            "cosine similarity of the pre-logits vector with the original's (this model has no classifier head)")


def choose(ctx) -> FaithChoice | None:
    """The settings' widgets (methods, target, steps; rollout, flow, seeds and protocol in an expander) and the
    protocol's caption above them; None, with a line saying so, when no method is chosen."""
    L, H = ctx.result.attention.shape[:2]
    protocol_slot = st.empty()  # filled once the replacement below is chosen: the caption states it
    c1, c2, c3 = st.columns([3, 1, 2])
    with c3:
        with st.expander("Rollout and attention-flow settings"):
            fusion = st.selectbox("Head fusion", FUSIONS, key="faith_fusion")
            discard = st.slider("Discard lowest share", 0.0, 0.95, 0.0, 0.05, key="faith_discard")
            start, end = st.slider("Rollout layers", 1, L, (1, L), key="faith_layers")
            flow_start, flow_end = st.slider("Attention-flow layers", 1, L, (1, L), key="faith_flow_layers",
                                             help="Max-flow costs about one solve per patch, growing with the layers: "
                                                  "a shorter range is faster.")
            seed = int(st.number_input(f"First random seed (of {RANDOM_SEEDS})", 0, 2**31 - 1, 0, key="faith_seed",
                                       help=f"The random floor is the mean over {RANDOM_SEEDS} seeded random maps, "
                                            "with their spread: one seed alone moves the AUC by a few hundredths. "
                                            + concepts_link("chance")))
            replacement = st.selectbox("Removed patches become", REPLACEMENTS, key="faith_replacement",
                                       format_func=lambda r: REPLACEMENT_TEXT[r],
                                       help="mean: 0 in the normalised input (the dataset mean colour, as the "
                                            "deletion protocol has it); blur: RISE's blurred copy of the image. "
                                            + concepts_link("definitions-used"))
            ordering = st.selectbox("Order of signed maps", ORDERINGS, key="faith_ordering",
                                    help="AttnLRP, CP-LRP and Gradient × Input are signed. signed: most positive "
                                         "first, most negative last; positive: negative values tie at 0; absolute: "
                                         "|value|. The choice changes the ranking and is named in every table.")
    protocol_slot.caption(f"Protocol: {protocol_text(replacement)}. Score: {_score_text(ctx)}. Random maps: the floor, "
                          f"the mean of {RANDOM_SEEDS} seeds; a map counts as better than chance only below their "
                          "spread on deletion (or above it on insertion): one seed alone moves by a few hundredths.")
    target = None
    if ctx.loaded.has_head:
        top = top_classes(ctx.result.logits, k=10, labels=ctx.lens.class_labels)
        label = c2.selectbox("Target class", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key="faith_target")
        target = int(label.split(":")[0])
    steps = int(c2.number_input("Steps", 2, 41, 11, key="faith_steps", help="fractions 0, 1/(S-1), ..., 1"))
    attributions, options = attribution_options(ctx.lens), method_options(ctx)
    # The methods worth computing first: relevance (AttnLRP), attention (rollout) and chance (random).
    methods = c1.multiselect("Methods (default: the ones worth computing first — AttnLRP, rollout, random)", options,
                             default=[m for m in DEFAULT_METHODS if m in options], format_func=method_label,
                             key="faith_methods")
    if not methods:
        st.info("Choose at least one method.")
        return None
    return FaithChoice(methods, attributions, fusion, discard, start, end, flow_start, flow_end, seed, replacement,
                       ordering, target, steps)


def perturbation_run(ctx, s: FaithChoice) -> FoldedSeeds | None:
    """The perturbation test of ``s``, computed when the button is pressed and kept for this image and these
    settings, with the random seeds folded into one row; None (and a line saying why) until the button is pressed."""
    key, forwards = s.key(ctx), s.settings().forwards()
    run_slot = st.empty()  # the button goes away once the result is there
    label = f"Run the perturbation test ({counted(len(s.methods), 'method')}, {counted(forwards, 'forward pass')})"
    if cached(key) is None and not run_slot.button(label, type="primary", key="faith_run"):
        st.info("Each method's curves need its perturbed inputs run through the model; press the button to start. "
                "Results are kept for this image and these settings.")
        return None
    full, lerf_full = image_faithfulness(ctx, s.settings())
    run_slot.empty()
    # The random floor: its seeds' curves and AUCs become one "random" row (mean over seeds; the map shown is the
    # first seed's), and the seeds' spread decides what can be told from chance.
    return fold_random_seeds(full, lerf_full)


def _signed() -> set[str]:
    """The registry's signed methods: their maps are drawn diverging around 0 and ordered as the choice says."""
    return {n for n, m in registered().items() if m.signed}


def _aucs(result: Faithfulness) -> dict[str, tuple[float, float]]:
    """method -> (deletion AUC, insertion AUC)."""
    return {m: (d, i) for m, d, i in zip(result.methods, result.deletion_auc, result.insertion_auc)}


def _auc_table(run: FoldedSeeds, named: dict[str, str]) -> pd.DataFrame:
    """The AUC table under its data names (the CSV's), with the verdicts against chance when there is a band."""
    result, band = run.result, run.band
    lerf_auc = auc_of(run.lerf, result.fractions)
    table = pd.DataFrame(result.table(band)).assign(method=lambda t: t["method"].map(named), lerf_auc=lerf_auc,
                                                    lerf_minus_morf=lerf_auc - result.deletion_auc)
    if band is not None:
        table["vs chance: deletion"] = [band.compare("deletion", d) if m != "random" else
                                        f"± {band.band('deletion')[1]:.3f} s.d." for m, d in
                                        zip(result.methods, result.deletion_auc)]
        table["vs chance: insertion"] = [band.compare("insertion", i) if m != "random" else
                                         f"± {band.band('insertion')[1]:.3f} s.d." for m, i in
                                         zip(result.methods, result.insertion_auc)]
    return table


def auc_section(ctx, s: FaithChoice, run: FoldedSeeds) -> None:
    """The curves of every method, the AUC table with its captions and verdicts against chance, and the run's
    downloads."""
    result, band = run.result, run.band
    auc = _aucs(result)
    stem = file_stem("faithfulness", ctx.image.name, f"{s.steps}steps")
    show_chart(curves_figure(result.fractions, result.deletion, result.insertion, result.methods, result.score, auc),
               "faith_curves", stem)

    st.subheader("AUC per method")
    signed = _signed()
    named = {m: method_label(m) + (f" ({s.ordering} order)" if m in signed else "") for m in result.methods}
    if band is not None:
        named["random"] = f"random (mean of {counted(band.seeds, 'seed')})"
    table = _auc_table(run, named)
    st.dataframe(screen_table(table), hide_index=True, key="faith_table", column_config=AUC_COLUMNS)
    reference = result.reference()

    def best(protocol: str) -> str:
        """The best method on ``protocol``, with "(within chance)" when the random maps' band cannot tell it apart."""
        name = reference["best"][protocol]
        return method_label(name) + qualify_best(band, protocol, auc[name][0 if protocol == "deletion" else 1])

    st.caption(f"Score: {result.score}. Best on deletion: {best('deletion')}; best on "
               f"insertion: {best('insertion')}; worst on deletion: "
               f"{method_label(reference['worst']['deletion'])}; worst on insertion: "
               f"{method_label(reference['worst']['insertion'])}. Removed patches become "
               f"{REPLACEMENT_TEXT[s.replacement]}. LeRF removes the least relevant patches first (its AUC matches "
               "insertion's up to rounding); LeRF − MoRF is the AttnLRP paper's summary. Click a column header to "
               "sort. One image: no claim beyond it; the dataset view above gives intervals over an image set.")
    if band is not None:
        st.markdown(f"**Against chance** (random maps over {counted(band.seeds, 'seed')}, seeds "
                    f"{s.seed}–{s.seed + band.seeds - 1}; a method counts as better or worse only outside the seeds' "
                    "mean ± 2 standard deviations):")
        st.markdown("\n".join(f"- {band.sentence(named[m], d, i)}" for m, d, i in
                              zip(result.methods, result.deletion_auc, result.insertion_auc) if m != "random"))
    settings = {"image": ctx.image.name, "model": ctx.loaded.card()["spec"], "protocol": protocol_text(s.replacement),
                "score": result.score,
                "target_class": result.target, "methods": result.methods, "fractions": result.fractions.tolist(),
                "patches_per_step": result.counts.tolist(),
                "rollout": {"fusion": s.fusion, "discard": s.discard, "layers (1-based, inclusive)": [s.start, s.end]},
                "attention_flow": {"layers (1-based, inclusive)": [s.flow_start, s.flow_end],
                                   "definition": FLOW_DEFINITION},
                "random_seeds": list(range(s.seed, s.seed + (band.seeds if band else 1))),
                "random_auc_per_seed": None if band is None else {"deletion": band.deletion.tolist(),
                                                                  "insertion": band.insertion.tolist()},
                "signed_map_ordering": s.ordering, "replacement": REPLACEMENT_TEXT[s.replacement],
                "lerf_auc": dict(zip(result.methods, table["lerf_auc"].tolist())), "heads": "1-based in method names",
                "auc": {m: {"deletion": d, "insertion": i} for m, (d, i) in auc.items()},
                "reference": reference}
    download_row(stem, {"fractions": result.fractions, "deletion": result.deletion, "insertion": result.insertion,
                        "maps": result.maps, "methods": np.array(result.methods)}, settings)
    download_row(f"{stem}_auc", table, None)  # the AUC table above, as a csv (its settings are the row above's)


def model_saw_section(ctx, s: FaithChoice, result: Faithfulness) -> None:
    """One method's deletion and insertion inputs at one step, as the model saw them, with their scores."""
    layout, loaded = ctx.result.layout, ctx.loaded
    st.subheader("What the model saw")
    m1, m2 = st.columns([2, 3])
    shown_method = m1.selectbox("Order of", result.methods, format_func=method_label, key="faith_shown_method")
    step = m2.select_slider("Step", options=list(range(len(result.fractions))), value=len(result.fractions) // 2,
                            format_func=lambda s: f"{result.fractions[s]:.0%} ({counted(result.counts[s], 'patch')})",
                            key="faith_step")
    m = result.methods.index(shown_method)
    model_input = preprocess([ctx.image.image], loaded.data_config).tensor[0]
    pictures = to_rgb(step_inputs(model_input, result.maps[m], int(result.counts[step]), layout, s.replacement),
                      loaded.data_config)
    p1, p2, _ = st.columns([1, 1, 1])
    p1.image(pictures[0], caption=f"deletion: top {result.counts[step]} of {layout.num_patches} patches replaced by "
                                  f"{REPLACEMENT_TEXT[s.replacement]} · score {result.deletion[m, step]:.4f}",
             width="stretch")
    p2.image(pictures[1], caption=f"insertion: only the top {counted(result.counts[step], 'patch')} kept · score "
                                  f"{result.insertion[m, step]:.4f}", width="stretch")


def maps_section(ctx, result: Faithfulness) -> None:
    """Each method's map beside its curves (against the random floor's), with the map's downloads."""
    r, layout = ctx.result, ctx.result.layout
    st.subheader("Each method's map and its curves")
    display = display_controls("faith_")
    signed, auc = _signed(), _aucs(result)
    floor = result.methods.index("random") if "random" in result.methods else None
    for m, name in enumerate(result.methods):
        left, right = st.columns([2, 3])
        with left:
            # One colour rule per method on every page: relevance (signed) diverging around 0, the rest sequential.
            rendered, fig = map_figure(r.model_input, result.maps[m][None], layout, display, titles=[""],
                                       title=method_label(name), columns=1, value_name=method_unit(name), tile_px=260,
                                       signed=name in signed)
            map_stem = file_stem("faithfulness_map", ctx.image.name, name)
            show_chart(fig, f"faith_map_{name}", map_stem, vector=False)
        with right:
            show_chart(method_curve_figure(result.fractions, result.deletion[m], result.insertion[m], name,
                                           result.score, None if floor is None or floor == m else
                                           (result.deletion[floor], result.insertion[floor])),
                       f"faith_curve_{name}", file_stem("faithfulness_curve", ctx.image.name, name))
            d, i = auc[name]
            st.caption(f"AUC deletion {d:.4f} · insertion {i:.4f}. " + rendered.caption())
            download_row(map_stem, {"map": result.maps[m], "deletion": result.deletion[m],
                                    "insertion": result.insertion[m], "fractions": result.fractions},
                         display.settings(rendered) | {"method": name, "image": ctx.image.name,
                                                       "auc": {"deletion": d, "insertion": i}},
                         panel_download(r.model_input, result.maps[m][None], display, [""], method_label(name),
                                        columns=1, value_name=method_unit(name), signed=name in signed))
