"""``analyze``'s run: images streamed through the model batch by batch into DIR/analysis.npz and DIR/settings.json,
written whole or not at all (:class:`vitviz.io.output.RunOutput`). The command line (:mod:`vitviz.cli.analyze`) checks
the options and decodes the files; :func:`vitviz.save` (a traced batch) and notebooks write the same files through
here."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..errors import VitvizError
from ..io.output import RunOutput, versions

WINDOW_ATTENTION = "window_attention_"  # window models: window_attention_<i> in analysis.npz is blocks.<i>.attn
ATTENTION_CONVENTION = ("softmax probabilities, rows (last axis) sum to 1; token order = token_layout.prefix_tokens "
                        "then patches in raster order")


@dataclass
class Written:
    """What a run wrote: one record per image (name, sha256, notes, top-1) for settings.json and the summary line."""

    images: list[dict] = field(default_factory=list)


def top1(arrays: dict, i: int, loaded) -> dict:
    """settings.json's record of image ``i``'s top-1 class, named (``--labels``, the model's own or ImageNet's)."""
    from ..analyses.tokens import top_classes

    if "logits" not in arrays:
        return {}
    (index, name, probability), = top_classes(arrays["logits"][i], 1, loaded.class_labels)
    return {"top1": {"class": index, "name": name, "probability": probability}}


def image_record(im, arrays: dict, i: int, loaded) -> dict:
    return {"name": im.name, "sha256": im.sha256, "notes": im.notes} | top1(arrays, i, loaded)


def write_analysis(out: Path, loaded, batches: Iterable[tuple[int, list]], settings, *, keep_attention: bool = True,
                   report: bool = False, report_formats: tuple[str, ...] | None = None, edit=None, layout=None,
                   register_info: dict | None = None, skipped: list[dict] = (),
                   progress: Callable[[int], None] | None = None, trace=None) -> Written:
    """Analyse each batch of :class:`~vitviz.io.images.LoadedImage` (``(files done, images)`` pairs) with
    :func:`vitviz.runs.analysis.analyze_batch` and write DIR/analysis.npz and DIR/settings.json.

    Args:
        settings: the analyses to run (:class:`vitviz.runs.analysis.AnalysisSettings`).
        keep_attention: write the raw attention (B, L, H, N, N) (every analysis runs either way).
        report: also write PNGs of each image's rollout and last layer's heads, and the run's figures.
        report_formats: the report's formats (``("svg", "pdf")``: :mod:`vitviz.figures.analysis_report`), with the
            multi-panel figures per image; None: the PNGs only, as without ``--format``.
        edit, layout: a test-time register's edit of the forward and its token layout (:mod:`vitviz.runs.registers_run`).
        trace: the one batch's forward already run (:func:`save`): analysed instead of running the model again.
    """
    from ..figures.analysis_report import write_image_report, write_run_report
    from .analysis import AnalysisRun, analyze_batch, analyze_trace

    run, written = AnalysisRun(loaded, settings), Written()
    with RunOutput(out) as output:
        for done, batch in batches:
            try:
                part = analyze_batch(loaded, [im.image for im in batch], settings, keep_attention=keep_attention or report,
                                     edit=edit, layout=layout) if trace is None else analyze_trace(
                    loaded, trace, settings, keep_attention=keep_attention or report, edit=edit)
            except ValueError as exc:  # parameter out of range, e.g. a layer past the model's depth
                raise VitvizError(f"Invalid analysis setting: {exc}") from exc
            run.add(part)
            output.arrays.append({k: v for k, v in part.arrays.items() if keep_attention or k != "attention"})
            if report:
                write_image_report(part.arrays, part.input_images, [im.name for im in batch], part.layout,
                                   output.file, first=len(written.images), formats=report_formats or ("png",),
                                   paper=report_formats is not None)
            written.images += [image_record(im, part.arrays, i, loaded) for i, im in enumerate(batch)]
            if progress:
                progress(done)
        final = run.final_arrays()
        output.arrays.add(final)
        if report:
            write_run_report(final, output.file, formats=report_formats or ("png",))
        output.commit({
            "command": "analyze",
            "model": loaded.card(),
            "versions": versions(),
            "images": written.images,
            "skipped": list(skipped),
            "arrays": output.arrays.shapes(),
            "analysis": run.info() | {"attention_saved": keep_attention}
            | ({"test_time_register": register_info} if register_info else {}),
            "conventions": {"attention": ATTENTION_CONVENTION},
        })
    return written


def write_window_analysis(out: Path, loaded, batches: Iterable[tuple[int, list]], settings, *,
                          keep_attention: bool = True, skipped: list[dict] = (),
                          progress: Callable[[int], None] | None = None, trace=None) -> Written:
    """The analyses that apply to window attention (Swin): window probabilities, the mean attention distance within
    windows per block and head, and ``settings.attribution``'s methods, written as :func:`write_analysis` does.

    settings.json records each block's windows (``window_geometry``, :meth:`WindowGeometry.to_dict`) and the token
    layout of the input (``token_layout``), which :func:`load` reads back.

    Args:
        trace: the one batch's forward already run (:func:`save`; ``attn`` of every block, ``final_norm``, ``logits``
            for a model with a head): analysed instead of running the model again.
    """
    from .. import swin
    from .analysis import attribution_arrays, attribution_info
    from ..analyses.per_image import analyse, analyse_images
    from ..tensors import to_host

    written, geometry, facts, fwd = Written(), None, {}, None
    with RunOutput(out) as output:
        for done, batch in batches:
            fwd = analyse_images(loaded, [im.image for im in batch]) if trace is None else analyse(trace)
            batch_trace = fwd.trace
            geometry = batch_trace.geometry
            arrays = {"input": batch_trace.inputs.tensor.numpy(),
                      "features": to_host(batch_trace["final_norm"].float()),
                      "window_distance": swin.heads_padded(fwd.window_distance)}
            if batch_trace.logits is not None:
                arrays["logits"] = to_host(batch_trace.logits.float())
            if keep_attention:
                arrays |= {f"{WINDOW_ATTENTION}{g.index}": to_host(a)
                           for a, g in zip(batch_trace.each("attn"), geometry)}
            if settings.attribution:
                batch_facts: dict = {}
                attribution_arrays(loaded, batch_trace.inputs.tensor, settings, arrays, batch_facts)
                for key, values in batch_facts.items():
                    facts.setdefault(key, []).extend(values)
            output.arrays.append(arrays)
            written.images += [image_record(im, arrays, i, loaded) for i, im in enumerate(batch)]
            if progress:
                progress(done)
        output.arrays.add({"window_uniform_distance": fwd.uniform_distance})
        output.commit({
            "command": "analyze", "model": loaded.card(), "versions": versions(), "images": written.images,
            "skipped": list(skipped), "arrays": output.arrays.shapes(), "attention_saved": keep_attention,
            "window_geometry": [g.to_dict() for g in geometry], "token_layout": fwd.trace.layout.to_dict(),
            **({"analysis": {"attribution": attribution_info(settings.attribution, facts)}}
               if settings.attribution else {}),
            "conventions": {
                "window_attention_<block>": "(B, nW, H, T, T) softmax probabilities of block <block> (0-based, "
                                            "across stages) with relative position bias and shift mask; windows and "
                                            "slots in the library's partition order of the cyclically shifted, "
                                            "padded grid (timm rolls then pads, transformers pads then rolls)",
                "window_distance": f"(B, blocks, max heads) pixels, NaN where a stage has fewer heads: "
                                   f"{swin.DISTANCE_CONVENTION}",
                "window_uniform_distance": "(blocks,) the same for uniform attention over each query's window"},
        })
    return written


# --- a Trace as analyze's files, and back ------------------------------------------------------------

TRACE_POINTS = {"attention": "attn", "token_norms": "resid_post.norm"}  # analysis.npz array -> the trace's kind
MODEL_ARRAYS = {"features": "final_norm", "logits": "logits"}  # analysis.npz array -> the trace's model-level point


def _block_kinds(window: bool) -> tuple[str, ...]:
    """The per-block kinds analysis.npz holds: a window model's analyze writes no token norms."""
    return ("attn",) if window else tuple(TRACE_POINTS.values())


def save(trace, folder: str | Path, settings=None, lens=None) -> Path:
    """Write ``python -m vitviz analyze``'s DIR/analysis.npz and DIR/settings.json for the images of ``trace``.

    The analyses are analyze's (``settings``, default its defaults), read from the trace's points; the arrays equal
    the command's for the same images in one batch (it runs at most ``--batch-size`` 8 at a time). Points the
    trace does not keep are taken from one more forward of its input (a trace run with ``edit=`` must keep them:
    attn, resid_post.norm, final_norm and logits; for a window model (Swin) attn, final_norm and logits). Kept
    points analysis.npz has no place for (``q``, ``pooled``, ...) go to DIR/trace.npz and DIR/trace.json. Read the
    folder back with :func:`load`.

    A window model's trace is written as analyze writes that model's run (:func:`write_window_analysis`): each
    block's ``window_attention_<block>`` (B, nW, H, T, T), the window distances, the features and logits, and the
    windows' geometry in settings.json; of ``settings`` only ``attribution`` and ``target_class`` apply to it.

    Args:
        trace: a batch's :class:`vitviz.Trace` from :meth:`vitviz.Lens.trace` (or with ``lens`` given).
        folder: the output folder (created; files written whole or not at all).
        settings: :class:`vitviz.runs.analysis.AnalysisSettings` (rollout fusion, flow, ...).
        lens: the :class:`vitviz.Lens` whose model ran the trace; default ``trace.lens``.

    Raises:
        VitvizError: a trace without its model, input or batch axis, an edited one missing points, or settings that
            do not apply to a window model.
    """
    from ..analyses.per_image import analysis_trace
    from ..io.lock import output_lock
    from .analysis import AnalysisSettings

    lens = lens or trace.lens
    if lens is None or trace.inputs is None or not trace.batched:
        raise VitvizError("vitviz.save needs a batch's trace from Lens.trace (its model and input); this one "
                          + ("has no Lens: pass lens=." if lens is None else
                             "has no input." if trace.inputs is None else "is one image's: save the batch's trace."))
    window = lens.scope == "window"
    settings = settings or AnalysisSettings()
    if window:
        _check_window_settings(settings, lens.label)
    analysed = trace
    if not _has_analysis_points(trace, lens, window):
        if trace.edited:
            needed = [*_block_kinds(window), "final_norm"] + (["logits"] if lens.has_head else [])
            raise VitvizError("this trace ran with edit= and lacks what analyze reads: keep "
                              f"{', '.join(map(repr, needed[:-1]))} and {needed[-1]!r}.")
        analysed = analysis_trace(lens, trace.inputs, layout=trace.layout)
    inputs = trace.inputs
    sources = inputs.sources or [_Unnamed(f"image {i + 1}") for i in range(len(inputs.tensor))]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with output_lock(folder, "save"):
        write = write_window_analysis if window else write_analysis
        write(folder, lens.loaded, [(len(sources), sources)], settings, trace=analysed)
        extra = {name: value for name, value in trace.items() if not _in_analysis(name, window)}
        if extra:
            type(trace)(extra, trace.layout, trace.num_layers).save(folder)
    return folder


@dataclass
class _Unnamed:
    """settings.json's record of an image given as a tensor: a name, no file behind it."""

    name: str
    sha256: str | None = None
    notes: list = field(default_factory=list)


def window_settings(attribution: bool) -> set[str]:
    """The analyze settings that apply to a window model (Swin): attribution, and its target class when it runs.
    ``save`` and the CLI's ``analyze`` refuse the others with a sentence."""
    return {"attribution", "target_class"} if attribution else {"attribution"}


def _check_window_settings(settings, label: str) -> None:
    """A window model's analyze runs attribution only (the CLI refuses the other options the same way)."""
    from dataclasses import fields

    from .analysis import AnalysisSettings

    default = AnalysisSettings()
    applies = window_settings(bool(settings.attribution)) | {"batch_size"}
    given = [f.name for f in fields(settings) if f.name not in applies
             and getattr(settings, f.name) != getattr(default, f.name)]
    if given:
        raise VitvizError(f"{label} attends within shifted windows (no CLS token, no attention over the whole image): "
                          f"the settings {', '.join(given)} do not apply to it; of AnalysisSettings only attribution "
                          "and target_class (the attribution's target) do.")


def _in_analysis(name: str, window: bool) -> bool:
    kind = name.split(".", 2)[2] if name.startswith("blocks.") else None
    return kind in _block_kinds(window) or name in MODEL_ARRAYS.values()


def _has_analysis_points(trace, lens, window: bool) -> bool:
    every = list(range(trace.num_layers))
    return (all(trace.layers(kind) == every for kind in _block_kinds(window)) and "final_norm" in trace
            and (trace.logits is not None or not lens.has_head))


def load(folder: str | Path):
    """A :class:`vitviz.Trace` read from a folder that ``python -m vitviz analyze`` or :func:`save` wrote (or one
    :meth:`vitviz.Trace.save` wrote: trace.npz alone). Arrays are read without pickle.

    analysis.npz's ``attention`` becomes the ``attn`` points (one stack), ``token_norms`` ``resid_post.norm``,
    ``features`` ``final_norm``, ``logits`` ``logits`` and ``input`` the trace's input; trace.npz adds its points;
    the folder's other arrays (rollout, mean_distance, ...) and settings.json are in ``trace.saved``.

    A window model's folder (Swin) reads as :meth:`vitviz.Lens.trace` returns that model's trace: each
    ``window_attention_<block>`` (B, nW, H, T, T) float32 becomes ``blocks.<block>.attn`` (per block, no stack: the
    stages differ in shape), ``features`` (B, gh, gw, D) ``final_norm``, and settings.json's ``window_geometry`` the
    trace's :attr:`~vitviz.Trace.geometry` (one :class:`~vitviz.adapters.windows.WindowGeometry` per block); window
    distances and attributions are in ``trace.saved``.

    Raises:
        VitvizError: the folder holds neither, its files do not agree, or it is a window model's written before
            vitviz recorded the padding order its windows need.
    """
    import json

    import numpy as np
    import torch

    from ..adapters.windows import WindowGeometry
    from ..layout import TokenLayout
    from ..trace import TRACE_ARRAYS, Trace, load_trace
    from ..types import ModelInput

    folder = Path(folder)
    if not (folder / "analysis.npz").exists():
        if (folder / TRACE_ARRAYS).exists():
            return load_trace(folder)
        raise VitvizError(f"{folder}: neither analyze's analysis.npz nor a trace.npz is there.")
    try:
        settings = json.loads((folder / "settings.json").read_text())
        with np.load(folder / "analysis.npz", allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        window = "window_geometry" in settings
        if window:  # a folder written before settings.json had its own token_layout: the model's, which analyze ran at
            layout = TokenLayout.from_dict(settings.get("token_layout") or settings["model"]["token_layout"])
        else:
            layout = TokenLayout.from_dict(settings["analysis"]["token_layout"])
        records = settings["window_geometry"] if window else []
        inputs = ModelInput(tensor=torch.from_numpy(arrays.pop("input")), images=[])
    except (OSError, KeyError, ValueError) as exc:
        raise VitvizError(f"{folder}: not a folder analyze wrote ({type(exc).__name__}: {exc}).") from exc
    try:
        geometry = [WindowGeometry.from_dict(record) for record in records] if window else None
    except (KeyError, ValueError) as exc:
        raise VitvizError(f"{folder}: a window model's analysis whose settings.json cannot place its windows ({exc}); "
                          "run python -m vitviz analyze again with this vitviz.") from exc
    points, stacked = {}, {}
    if window:
        num_layers = len(geometry)
        points = {f"blocks.{i}.attn": torch.from_numpy(arrays.pop(f"{WINDOW_ATTENTION}{i}"))
                  for i in range(num_layers) if f"{WINDOW_ATTENTION}{i}" in arrays}  # none with --no-attention
    else:
        for array, kind in TRACE_POINTS.items():
            if array in arrays:
                stacked[kind] = torch.from_numpy(arrays.pop(array))
                points |= {f"blocks.{i}.{kind}": stacked[kind][:, i] for i in range(stacked[kind].shape[1])}
        num_layers = stacked["resid_post.norm"].shape[1]  # token_norms (B, L, N): written even with --no-attention
    points |= {point: torch.from_numpy(arrays.pop(array)) for array, point in MODEL_ARRAYS.items() if array in arrays}
    extra = load_trace(folder) if (folder / TRACE_ARRAYS).exists() else {}
    points |= dict(extra)
    return Trace(points, layout, num_layers, inputs=inputs, geometry=geometry, stacked=stacked,
                 saved={"arrays": arrays, "settings": settings})
