"""The Compare models page's per-head statistics: the tables to compare (:func:`stats_tables`: uploaded, typed, or run
here on the sidebar's images), the statistic and depth axis (:func:`choose_statistic`) and the plot against depth with
its per-layer table and downloads (:func:`depth_section`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pandas as pd
import streamlit as st

from ui.cache import operator_settings, store
from ui.charts import file_stem, show_chart
from ui.downloads import download_row
from ui.guard import guarded
from ui.uploads import upload_too_large
from ui.words import counted
from vitviz.analyses.compare import (STATISTICS, StatsTableError, check_stats_table, combine, head_summary,
                                     layer_summary, model_overview, read_stats_table, stats_path)
from vitviz.analyses.stats import table_for_images
from vitviz.errors import VitvizError
from vitviz.figures.compare_figures import depth_comparison
from vitviz.sources.names import canonical_model_name


def intro() -> None:
    """What the per-head statistics against depth show, as the ViT paper drew them."""
    st.caption("In the ViT paper (Fig. 7 right, Appendix D.7) some heads attend across the whole image already in the "
               "lowest layers while others stay local, and hybrids (a ResNet stem before the Transformer) have fewer "
               "local early heads; the same plot compares supervised and self-supervised (DINO, DINOv2) models.")


def unique_name(name: str, taken) -> str:
    """Every run writes a file called stats.parquet: the same name twice is two sources, "name (2)"."""
    return next(n for n in [name] + [f"{name} ({k})" for k in range(2, len(taken) + 2)] if n not in taken)


@dataclass
class Sources:
    """The tables read so far by source name, and what to say under the row of sources (errors, then notes)."""
    tables: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _uploaded(files, sources: Sources) -> None:
    uploads = files.file_uploader("Stats tables (stats.parquet)", type=["parquet"], accept_multiple_files=True,
                                  key="compare_uploads",
                                  help="Written by `python -m vitviz stats IMAGES --model M [--model M2 ...] --out "
                                       "DIR`; one model per file or several.")
    digests: dict = st.session_state.setdefault("compare_digests", {})  # file_id -> SHA-256, hashed once per upload
    seen: dict[str, str] = {}  # SHA-256 -> source name
    for upload in uploads or []:
        source = unique_name(upload.name, sources.tables)
        try:
            if too_large := upload_too_large(upload.name, upload.size):
                raise StatsTableError(too_large)
            digest = digests.setdefault(upload.file_id, hashlib.sha256(upload.getbuffer()).hexdigest())
            if digest in seen:
                sources.notes.append(f"{upload.name}: the same file as {seen[digest]}; shown once.")
                continue
            seen[digest] = source
            sources.tables[source] = store().get_or_compute(
                ("stats_table", digest), lambda: read_stats_table(upload.getvalue(), upload.name))
        except VitvizError as exc:
            sources.problems.append(str(exc))


def _typed(local, sources: Sources) -> None:
    typed = local.text_input("... or a stats folder or .parquet path on this machine", key="compare_path",
                             placeholder="out/  (the --out folder of `python -m vitviz stats`)").strip()
    if not typed:
        return
    path = stats_path(typed)
    try:
        stamp = path.stat().st_mtime_ns if path.is_file() else None  # a rewritten table is read again
        sources.tables[typed] = store().get_or_compute(("stats_table", str(path), stamp),
                                                       lambda: read_stats_table(path, typed))
    except VitvizError as exc:
        sources.problems.append(str(exc))


def _session_runs(ctx, local) -> dict:
    """This session's in-app runs by model label: a button adds the sidebar's image set with the current model."""
    runs: dict = st.session_state.setdefault("compare_runs", {})
    if ctx is not None and ctx.loaded.why_not("stats"):
        local.info(ctx.loaded.why_not("stats"))
    elif ctx is not None:
        # The model's one name, as `vitviz stats --model` writes it: a table of the same model sits beside this run
        # as "name (source)", not under a second name (its long label).
        label = canonical_model_name(ctx.spec.name) + (f" at {ctx.spec.img_size} px" if ctx.spec.img_size else "")
        if local.button(f"Add this session's {counted(len(ctx.images), 'image')} with the current model",
                        key="compare_run",
                        help=f"Runs {ctx.lens.label} on the sidebar's image set ({ctx.framing} framing) and adds "
                             f"it as one more model, named {label!r} as `python -m vitviz stats --model` names it."):
            bar = st.progress(0.0, text=f"{label}: running the model on the image set ...")
            table = table_for_images(
                ctx.loaded, [im.image for im in ctx.images], [im.name for im in ctx.images], model=label,
                progress=lambda done, total: bar.progress(done / total,
                                                          f"{label}: {done} of {counted(total, 'image')}"))
            bar.empty()
            runs[label] = check_stats_table(table, f"{label} (this session)")
    if runs and local.button("Remove this session's runs", key="compare_forget"):
        runs.clear()
    return runs


def stats_tables(ctx) -> dict[str, pd.DataFrame]:
    """The stats tables to compare by source name: uploaded files, a path typed on a private server, and this
    session's runs (``ctx`` None: no image, so no run here). What could not be read is said under the sources."""
    sources = Sources()
    files, local = st.columns(2)
    _uploaded(files, sources)
    if not operator_settings().shared:  # a shared server reads no file by a path a browser user names: uploads only
        _typed(local, sources)
    runs = _session_runs(ctx, local)
    for problem in sources.problems:
        st.error(problem)
    for note in sources.notes:
        st.info(note)
    if runs:
        sources.tables["this session"] = combine(runs)
    return sources.tables


def choose_statistic():
    """The statistic (a :data:`vitviz.analyses.compare.STATISTICS` entry) and whether depth is relative (layer / L)."""
    c1, c2 = st.columns(2)
    statistic = STATISTICS[c1.selectbox("Statistic", list(STATISTICS), format_func=lambda c: STATISTICS[c].axis_title,
                                        key="compare_statistic")]
    relative = c2.radio("Depth axis", ["layer", "relative depth (layer / L)"], horizontal=True, key="compare_depth",
                        help="Relative depth lines up models of different depth (e.g. ViT-B's 12 and ViT-L's "
                             "24 layers) at their last layer.") != "layer"
    return statistic, relative


def depth_caption(statistic) -> str:
    """Under the depth plot: what a dot, a bar and a line are."""
    return (f"Each dot is one head's {statistic.label} averaged over a model's images; error bars: ± one standard "
            "deviation over those images; lines: the mean over heads per layer. Each model's dots are shifted "
            "slightly left or right of the layer so models do not hide each other. "
            + ("Distances are in pixels of each model's own input, so models at other resolutions differ for that "
               "reason too. " if statistic.unit == "pixels" else "")
            + "Click a model in the legend to hide it.")


def depth_section(tables: dict[str, pd.DataFrame], statistic, relative: bool) -> None:
    """Every model's heads against depth, the mean per layer as a table (every layer shown), and the downloads."""
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
    st.caption(depth_caption(statistic))

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
