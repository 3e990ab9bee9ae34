"""``analyze``'s run: images streamed through the model batch by batch into DIR/analysis.npz and DIR/settings.json,
written whole or not at all (:class:`vitviz.io.output.RunOutput`). The command line (:mod:`vitviz.cli.analyze`) checks
the options and decodes the files; :meth:`vitviz.Trace.save` and notebooks write the same files through here."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..errors import VitvizError
from ..io.output import RunOutput, versions

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
                   register_info: dict | None = None,
                   skipped: list[dict] = (), progress: Callable[[int], None] | None = None) -> Written:
    """Analyse each batch of :class:`~vitviz.io.images.LoadedImage` (``(files done, images)`` pairs) with
    :func:`vitviz.runs.analysis.analyze_batch` and write DIR/analysis.npz and DIR/settings.json.

    Args:
        settings: the analyses to run (:class:`vitviz.runs.analysis.AnalysisSettings`).
        keep_attention: write the raw attention (B, L, H, N, N) (every analysis runs either way).
        report: also write PNGs of each image's rollout and last layer's heads, and the run's figures.
        report_formats: the report's formats (``("svg", "pdf")``: :mod:`vitviz.figures.analysis_report`), with the
            multi-panel figures per image; None: the PNGs only, as without ``--format``.
        edit, layout: a test-time register's edit of the forward and its token layout (:mod:`vitviz.runs.registers_run`).
    """
    from ..figures.analysis_report import write_image_report, write_run_report
    from .analysis import AnalysisRun, analyze_batch

    run, written = AnalysisRun(loaded, settings), Written()
    with RunOutput(out) as output:
        for done, batch in batches:
            try:
                part = analyze_batch(loaded, [im.image for im in batch], settings,
                                     keep_attention=keep_attention or report, edit=edit, layout=layout)
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
                          progress: Callable[[int], None] | None = None) -> Written:
    """The analyses that apply to window attention (Swin): window probabilities, the mean attention distance within
    windows per block and head, and ``settings.attribution``'s methods, written as :func:`write_analysis` does."""
    from .. import swin
    from .analysis import attribution_arrays, attribution_info
    from .pipeline import forward

    written, geometry, facts, fwd = Written(), None, {}, None
    with RunOutput(out) as output:
        for done, batch in batches:
            fwd = forward(loaded, [im.image for im in batch])
            captured, geometry = fwd.capture, fwd.capture.geometry
            arrays = {"input": fwd.batch.tensor.numpy(), "features": captured.features.numpy(),
                      "window_distance": swin.heads_padded(fwd.distance)}
            if captured.logits is not None:
                arrays["logits"] = captured.logits.numpy()
            if keep_attention:
                arrays |= {f"window_attention_{g.index}": a.numpy() for a, g in zip(captured.attention, geometry)}
            if settings.attribution:
                batch_facts: dict = {}
                attribution_arrays(loaded, fwd.batch.tensor, settings, arrays, batch_facts)
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
            "window_geometry": [g.to_dict() for g in geometry],
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
