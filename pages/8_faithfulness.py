"""Faithfulness: which map to trust, by deleting and inserting patches in the order each map ranks them."""
import hashlib

import numpy as np
import pandas as pd
import streamlit as st
import torch

from ui.cache import operator_settings, store
from ui.charts import file_stem, show_chart
from ui.display import display_controls, map_figure, panel_download
from ui.downloads import download_row
from ui.image_faithfulness import FaithfulnessSettings, faithfulness_key, image_faithfulness, method_options
from ui.progress import cached
from ui.state import setup, view_applies
from ui.uploads import upload_too_large
from ui.navigation import concepts_link, heading
from vitviz.explainers import registered
from vitviz.perturbation.curves import (ORDERINGS, RANDOM_SEEDS, Faithfulness, qualify_best, split_random_seeds,
                                        to_rgb)
from vitviz.perturbation.curves import auc as auc_of
from vitviz.perturbation.protocols import (REPLACEMENT_TEXT, REPLACEMENTS, protocol_inputs, protocol_order,
                                           protocol_text, replacement_of)
from vitviz.runs.faithfulness_run import DEFAULT_METHODS
from vitviz.errors import VitvizError
from vitviz.figures.faithfulness_figures import curves_figure, dataset_figure, method_curve_figure, method_label, method_unit
from vitviz.perturbation.protocols import LABELS as PROTOCOL_LABELS
from vitviz.perturbation.stats import RESAMPLES, SEED, Interval, auc_path, read_auc_table, sentence, summarise
from vitviz.analyses.flow import FLOW_DEFINITION
from vitviz.sources.preprocess import preprocess
from vitviz.analyses.rollout import FUSIONS
from vitviz.analyses.tokens import top_classes



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
        st.caption(f"Grey band: the random floor's mean AUC over the {images} images for each of {seeds['seeds']} seeds, "
                   f"mean {seeds['mean']:.3f} ± 2 × {seeds['sd_over_seeds']:.3f} (s.d. over seeds). "
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


ctx = setup()
heading(__file__, ctx.image.name if ctx is not None else None)
view = st.radio("View", ["this image", "a finished run over an image set"], horizontal=True, key="faith_view",
                help="A run over an image set comes from `python -m vitviz faithfulness`: its auc.parquet gives "
                     "intervals over images and paired differences, which one image cannot.")
if view != "this image":
    dataset_view()
    st.stop()
if ctx is None:
    st.stop()
view_applies(ctx, "faithfulness")
r, layout, loaded = ctx.result, ctx.result.layout, ctx.loaded
L, H = r.attention.shape[:2]
score_text = ("softmax probability of the target class" if loaded.has_head else
              "cosine similarity of the pre-logits vector with the original's (this model has no classifier head)")
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
                                   help=f"The random floor is the mean over {RANDOM_SEEDS} seeded random maps, with "
                                        "their spread: one seed alone moves the AUC by a few hundredths. "
                                        + concepts_link("chance")))
        replacement = st.selectbox("Removed patches become", REPLACEMENTS, key="faith_replacement",
                                   format_func=lambda r: REPLACEMENT_TEXT[r],
                                   help="mean: 0 in the normalised input (the dataset mean colour, as the deletion "
                                        "protocol has it); blur: RISE's blurred copy of the image. "
                                        + concepts_link("definitions-used"))
        ordering = st.selectbox("Order of signed maps", ORDERINGS, key="faith_ordering",
                                help="AttnLRP, CP-LRP and Gradient × Input are signed. signed: most positive first, "
                                     "most negative last; positive: negative values tie at 0; absolute: |value|. "
                                     "The choice changes the ranking and is named in every table.")
protocol_slot.caption(f"Protocol: {protocol_text(replacement)}. Score: {score_text}. Random maps: the floor, the mean of "
                      f"{RANDOM_SEEDS} seeds; a map counts as better than chance only below their spread on deletion "
                      "(or above it on insertion): one seed alone moves by a few hundredths.")
target = None
if loaded.has_head:
    top = top_classes(r.logits, k=10, labels=ctx.lens.class_labels)
    label = c2.selectbox("Target class", [f"{i}: {name} ({p:.1%})" for i, name, p in top], key="faith_target")
    target = int(label.split(":")[0])
steps = int(c2.number_input("Steps", 2, 41, 11, key="faith_steps", help="fractions 0, 1/(S-1), ..., 1"))
options = method_options(ctx)
first = list(DEFAULT_METHODS)
methods = c1.multiselect("Methods (default: the ones worth computing first — AttnLRP, rollout, random)", options, default=[m for m in first if m in options], format_func=method_label,
                         key="faith_methods")
if not methods:
    st.info("Choose at least one method.")
    st.stop()

settings = FaithfulnessSettings(methods=tuple(methods), steps=steps, target=target, fusion=fusion, discard=discard,
                                start=start - 1, end=end, flow_start=flow_start - 1, flow_end=flow_end, seed=seed,
                                ordering=ordering, replacement=replacement)
key, forwards = faithfulness_key(ctx, settings), settings.forwards()
run_slot = st.empty()  # the button goes away once the result is there
if cached(key) is None and not run_slot.button(f"Run the perturbation test ({len(methods)} methods, {forwards} forward "
                                         "passes)", type="primary", key="faith_run"):
    st.info("Each method's curves need its perturbed inputs run through the model; press the button to start. "
            "Results are kept for this image and these settings.")
    st.stop()

full, lerf_full = image_faithfulness(ctx, settings)
run_slot.empty()
# The random floor: its seeds' curves and AUCs become one "random" row (mean over seeds; the map shown is the
# first seed's), and the seeds' spread decides what can be told from chance.
others, band = split_random_seeds(full)
seeds = [m for m in range(len(full.methods)) if m not in others]
rows = [*others, *seeds[:1]]
result = Faithfulness(methods=[full.methods[m] if m in others else "random" for m in rows], maps=full.maps[rows],
                      fractions=full.fractions, counts=full.counts, score=full.score, target=full.target,
                      deletion=np.concatenate([full.deletion[others], full.deletion[seeds].mean(0, keepdims=True)])
                      if seeds else full.deletion[others],
                      insertion=np.concatenate([full.insertion[others], full.insertion[seeds].mean(0, keepdims=True)])
                      if seeds else full.insertion[others])
lerf = np.concatenate([lerf_full[others], lerf_full[seeds].mean(0, keepdims=True)]) if seeds else lerf_full[others]
lerf_auc = auc_of(lerf, result.fractions)
auc = {m: (d, i) for m, d, i in zip(result.methods, result.deletion_auc, result.insertion_auc)}
stem = file_stem("faithfulness", ctx.image.name, f"{steps}steps")
show_chart(curves_figure(result.fractions, result.deletion, result.insertion, result.methods, result.score, auc),
           "faith_curves", stem)

st.subheader("AUC per method")
signed = {n for n, m in registered().items() if m.signed}
named = {m: method_label(m) + (f" ({ordering} order)" if m in signed else "") for m in result.methods}
if band is not None:
    named["random"] = f"random (mean of {band.seeds} seeds)"
table = pd.DataFrame(result.table(band)).assign(method=lambda t: t["method"].map(named), lerf_auc=lerf_auc,
                                            lerf_minus_morf=lerf_auc - result.deletion_auc)
if band is not None:
    table["vs chance: deletion"] = [band.compare("deletion", d) if m != "random" else
                                    f"± {band.band('deletion')[1]:.3f} s.d." for m, d in
                                    zip(result.methods, result.deletion_auc)]
    table["vs chance: insertion"] = [band.compare("insertion", i) if m != "random" else
                                     f"± {band.band('insertion')[1]:.3f} s.d." for m, i in
                                     zip(result.methods, result.insertion_auc)]
st.dataframe(screen_table(table), hide_index=True, key="faith_table", column_config=AUC_COLUMNS)
reference = result.reference()


def _best(protocol: str) -> str:
    """The best method on ``protocol``, with "(within chance)" when the random maps' band cannot tell it apart."""
    name = reference["best"][protocol]
    return method_label(name) + qualify_best(band, protocol, auc[name][0 if protocol == "deletion" else 1])


st.caption(f"Score: {result.score}. Best on deletion: {_best('deletion')}; best on "
           f"insertion: {_best('insertion')}; worst on deletion: "
           f"{method_label(reference['worst']['deletion'])}; worst on insertion: "
           f"{method_label(reference['worst']['insertion'])}. Removed patches become {REPLACEMENT_TEXT[replacement]}. "
           "LeRF removes the least relevant patches first (its AUC matches insertion's up to rounding); LeRF − MoRF "
           "is the AttnLRP paper's summary. Click a column header to sort. One image: no claim beyond it; the "
           "dataset view above gives intervals over an image set.")
if band is not None:
    st.markdown("**Against chance** (random maps over "
                f"{band.seeds} seeds, seeds {seed}–{seed + band.seeds - 1}; a method counts as better or worse only "
                "outside the seeds' mean ± 2 standard deviations):")
    st.markdown("\n".join(f"- {band.sentence(named[m], d, i)}" for m, d, i in
                          zip(result.methods, result.deletion_auc, result.insertion_auc) if m != "random"))
settings = {"image": ctx.image.name, "model": loaded.card()["spec"], "protocol": protocol_text(replacement),
            "score": result.score,
            "target_class": result.target, "methods": result.methods, "fractions": result.fractions.tolist(),
            "patches_per_step": result.counts.tolist(), "rollout": {"fusion": fusion, "discard": discard,
                                                                    "layers (1-based, inclusive)": [start, end]},
            "attention_flow": {"layers (1-based, inclusive)": [flow_start, flow_end], "definition": FLOW_DEFINITION},
            "random_seeds": list(range(seed, seed + (band.seeds if band else 1))),
            "random_auc_per_seed": None if band is None else {"deletion": band.deletion.tolist(),
                                                                "insertion": band.insertion.tolist()},
            "signed_map_ordering": ordering, "replacement": REPLACEMENT_TEXT[replacement],
            "lerf_auc": dict(zip(result.methods, lerf_auc.tolist())), "heads": "1-based in method names", "auc": {m: {"deletion": d, "insertion": i}
                                                                            for m, (d, i) in auc.items()},
            "reference": reference}
download_row(stem, {"fractions": result.fractions, "deletion": result.deletion, "insertion": result.insertion,
                    "maps": result.maps, "methods": np.array(result.methods)}, settings)
download_row(f"{stem}_auc", table, None)  # the AUC table above, as a csv (its settings are the row above's)

st.subheader("What the model saw")
m1, m2 = st.columns([2, 3])
shown_method = m1.selectbox("Order of", result.methods, format_func=method_label, key="faith_shown_method")
step = m2.select_slider("Step", options=list(range(len(result.fractions))), value=len(result.fractions) // 2,
                        format_func=lambda s: f"{result.fractions[s]:.0%} ({result.counts[s]} patches)",
                        key="faith_step")
m = result.methods.index(shown_method)
model_input = preprocess([ctx.image.image], loaded.data_config).tensor[0]
base, order = replacement_of(model_input, replacement), protocol_order(result.maps[m], "morf")
pictures = to_rgb(torch.cat([protocol_inputs(model_input, base, order, result.counts[step:step + 1], layout, p)
                             for p in ("morf", "insertion")]), loaded.data_config)
p1, p2, _ = st.columns([1, 1, 1])
p1.image(pictures[0], caption=f"deletion: top {result.counts[step]} of {layout.num_patches} patches replaced by "
                              f"{REPLACEMENT_TEXT[replacement]} · score {result.deletion[m, step]:.4f}", width="stretch")
p2.image(pictures[1], caption=f"insertion: only the top {result.counts[step]} patches kept · score "
                              f"{result.insertion[m, step]:.4f}", width="stretch")

st.subheader("Each method's map and its curves")
display = display_controls("faith_")
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
        show_chart(method_curve_figure(result.fractions, result.deletion[m], result.insertion[m], name, result.score,
                                       None if floor is None or floor == m else
                                       (result.deletion[floor], result.insertion[floor])),
                   f"faith_curve_{name}", file_stem("faithfulness_curve", ctx.image.name, name))
        d, i = auc[name]
        st.caption(f"AUC deletion {d:.4f} · insertion {i:.4f}. " + rendered.caption())
        download_row(map_stem, {"map": result.maps[m], "deletion": result.deletion[m], "insertion": result.insertion[m],
                                "fractions": result.fractions},
                     display.settings(rendered) | {"method": name, "image": ctx.image.name,
                                                   "auc": {"deletion": d, "insertion": i}},
                     panel_download(r.model_input, result.maps[m][None], display, [""], method_label(name), columns=1,
                                    value_name=method_unit(name), signed=name in signed))
