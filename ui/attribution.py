"""The Attribution page's cached computation: one model run per (image, methods, target), kept in the
session-shared store so a rerun only redraws."""
from __future__ import annotations

from ui.cache import cached_model, model_run
from ui.progress import with_progress
from vitviz.adapters import editing
from vitviz.attribution import Attribution, attribute, default_target
from vitviz.images import preprocess


def attributions(ctx, methods: list[str], target_class: int | None, side=None) -> list[Attribution]:
    """Each method's :class:`vitviz.attribution.Attribution` of the current image (one backward each); with
    ``side`` (:class:`ui.repair.Side`), its repair runs in every forward (:func:`vitviz.adapters.editing`)."""
    repair = None if side is None or side.edit is None else side.repair
    key = ("attribution", ctx.spec, ctx.image.sha256, tuple(methods), target_class) + ((repair,) if repair else ())

    def compute(progress):
        model = cached_model(ctx.spec)
        x = preprocess([ctx.image.image], model.data_config).tensor
        target = default_target(model.model, target_class)
        results = []
        with model_run(), editing(None if repair is None else side.edit):
            for i, method in enumerate(methods):
                progress(i, len(methods))
                results.append(attribute(model.model, x, method, target))
        return results

    return with_progress(key, "Attribution: method", compute)
