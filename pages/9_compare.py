"""Compare models: a per-head statistic against depth, several models overlaid (ViT paper Fig. 7 right); layer x layer
representation similarity (CKA) within a model or between two, a CNN included."""
import hashlib

import streamlit as st

from ui.cache import operator_settings, store
from ui.charts import file_stem, show_chart
from ui.downloads import download_row
from ui.guard import guarded
from ui.similarity import similarity_section
from ui.state import setup
from ui.uploads import upload_too_large
from ui.navigation import heading
from vitviz.analyses.compare import (STATISTICS, StatsTableError, check_stats_table, combine, head_summary, layer_summary,
                            model_overview, read_stats_table, stats_path)
from vitviz.figures.compare_figures import depth_comparison
from vitviz.errors import VitvizError
from vitviz.sources.names import canonical_model_name
from vitviz.analyses.stats import table_for_images


def _unique(name: str, taken) -> str:
    """Every run writes a file called stats.parquet: the same name twice is two sources, "name (2)"."""
    return next(n for n in [name] + [f"{name} ({k})" for k in range(2, len(taken) + 2)] if n not in taken)


ctx = setup()  # the tables need no image: without one, only the in-app run is unavailable
heading(__file__)
stats_tab, cka_tab = st.tabs(["Per-head statistics", "Layer similarity (CKA)"])
with cka_tab:
    similarity_section(ctx)
stats_tab.caption("In the ViT paper (Fig. 7 right, Appendix D.7) some heads attend across the whole image already in "
                  "the lowest layers while others stay local, and hybrids (a ResNet stem before the Transformer) have "
                  "fewer local early heads; the same plot compares supervised and self-supervised (DINO, DINOv2) "
                  "models.")

with stats_tab:
    tables: dict = {}
    problems: list[str] = []  # shown under the row of sources, across the page
    notes: list[str] = []
    files, local = st.columns(2)
    uploads = files.file_uploader("Stats tables (stats.parquet)", type=["parquet"], accept_multiple_files=True,
                                  key="compare_uploads",
                                  help="Written by `python -m vitviz stats IMAGES --model M [--model M2 ...] --out DIR`; "
                                       "one model per file or several.")
    digests: dict = st.session_state.setdefault("compare_digests", {})  # file_id -> SHA-256, hashed once per upload
    seen: dict[str, str] = {}  # SHA-256 -> source name
    for upload in uploads or []:
        source = _unique(upload.name, tables)
        try:
            if too_large := upload_too_large(upload.name, upload.size):
                raise StatsTableError(too_large)
            digest = digests.setdefault(upload.file_id, hashlib.sha256(upload.getbuffer()).hexdigest())
            if digest in seen:
                notes.append(f"{upload.name}: the same file as {seen[digest]}; shown once.")
                continue
            seen[digest] = source
            tables[source] = store().get_or_compute(("stats_table", digest),
                                                    lambda: read_stats_table(upload.getvalue(), upload.name))
        except VitvizError as exc:
            problems.append(str(exc))
    # A shared server reads no file by a path a browser user names: uploads only.
    if not operator_settings().shared:
        typed = local.text_input("... or a stats folder or .parquet path on this machine", key="compare_path",
                                 placeholder="out/  (the --out folder of `python -m vitviz stats`)").strip()
        if typed:
            path = stats_path(typed)
            try:
                stamp = path.stat().st_mtime_ns if path.is_file() else None  # a rewritten table is read again
                tables[typed] = store().get_or_compute(("stats_table", str(path), stamp),
                                                       lambda: read_stats_table(path, typed))
            except VitvizError as exc:
                problems.append(str(exc))

    runs: dict = st.session_state.setdefault("compare_runs", {})  # this session's in-app runs, by model label
    if ctx is not None and ctx.loaded.why_not("stats"):
        local.info(ctx.loaded.why_not("stats"))
    elif ctx is not None:
        # The model's one name, as `vitviz stats --model` writes it: a table of the same model sits beside this run
        # as "name (source)", not under a second name (its long label).
        label = canonical_model_name(ctx.spec.name) + (f" at {ctx.spec.img_size} px" if ctx.spec.img_size else "")
        if local.button(f"Add this session's {len(ctx.images)} image{'s' if len(ctx.images) != 1 else ''} with "
                        "the current model", key="compare_run",
                        help=f"Runs {ctx.lens.label} on the sidebar's image set ({ctx.framing} framing) and adds "
                             f"it as one more model, named {label!r} as `python -m vitviz stats --model` names it."):
            bar = st.progress(0.0, text=f"{label}: running the model on the image set ...")
            table = table_for_images(ctx.loaded, [im.image for im in ctx.images], [im.name for im in ctx.images],
                                     progress=lambda done, total: bar.progress(done / total, f"{label}: {done} of {total} images"),
                                     model=label)
            bar.empty()
            runs[label] = check_stats_table(table, f"{label} (this session)")
    if runs and local.button("Remove this session's runs", key="compare_forget"):
        runs.clear()
    for problem in problems:
        st.error(problem)
    for note in notes:
        st.info(note)
    if runs:
        tables["this session"] = combine(runs)

    if not tables:
        st.info("Upload one or more stats.parquet files, or add this session's images with the current model.")
        st.stop()

    c1, c2 = st.columns(2)
    statistic = STATISTICS[c1.selectbox("Statistic", list(STATISTICS), format_func=lambda c: STATISTICS[c].axis_title,
                                        key="compare_statistic")]
    relative = c2.radio("Depth axis", ["layer", "relative depth (layer / L)"], horizontal=True, key="compare_depth",
                        help="Relative depth lines up models of different depth (e.g. ViT-B's 12 and ViT-L's "
                             "24 layers) at their last layer.") != "layer"
    table = combine(tables)
    heads = head_summary(table, statistic.column)
    layers = layer_summary(heads)
    overview = model_overview(heads, layers)
    models = overview.index.tolist()
    if (overview["images"] == 0).any():
        st.warning(f"No {statistic.label} for {', '.join(overview.index[overview['images'] == 0])} (e.g. CLS focus "
                   "of a model without a CLS token).")
    stem = file_stem("compare", statistic.column, f"{len(models)}models")
    with guarded("the depth plot"):
        show_chart(depth_comparison(heads, layers, statistic, relative=relative), "compare_plot", stem)
    st.caption(f"Each dot is one head's {statistic.label} averaged over a model's images; error bars: ± one standard "
               "deviation over those images; lines: the mean over heads per layer. Each model's dots are shifted "
               "slightly left or right of the layer so models do not hide each other. "
               + ("Distances are in pixels of each model's own input, so models at other resolutions differ for that "
                  "reason too. " if statistic.unit == "pixels" else "")
               + "Click a model in the legend to hide it.")

    st.subheader(f"Mean over heads per layer ({statistic.unit})")
    per_layer = layers.assign(layer=layers["layer"] + 1, model=layers["model"].astype(str)) \
        .pivot(index="layer", columns="model", values="mean")[models]
    digits = 1 if statistic.unit == "pixels" else 3
    # As text: the grid draws a missing value (a layer the shallower model lacks) as "None", not as blank.
    st.dataframe(per_layer.rename_axis(index="layer (1-based)").map(lambda v: "–" if v != v else f"{v:.{digits}f}"),
                 column_config={m: st.column_config.TextColumn(m, width="medium", alignment="right") for m in models},
                 key="compare_table", height="content")  # every layer shows: no inner scroll hiding the last ones
    download_row(stem, heads.assign(statistic=statistic.column, unit=statistic.unit),
                 {"statistic": statistic.column, "label": statistic.label, "unit": statistic.unit,
                  "depth_axis": "relative depth (layer + 1) / L" if relative else "layer, 1-based",
                  "indexing": "layer and head count from 0 in the CSV and in stats.parquet, from 1 on screen",
                  "spread": "standard deviation over images (ddof=0); n_images counts images with a value",
                  "sources": {name: sorted(t["model"].unique()) for name, t in tables.items()},
                  "models": overview.to_dict(orient="index")})
