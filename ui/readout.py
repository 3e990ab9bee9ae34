"""The Readout page's computations, each run once per model, image (set) and target and kept for the session
(:func:`ui.progress.with_progress`): the direct readout of the current image, the logit lens of the image set and
the heads' names over the set."""
from __future__ import annotations

import numpy as np

import vitviz
from vitviz import residual

from .cache import model_run
from .progress import with_progress


def target_of(ctx, target_class: int | None, text: str | None = None):
    """CLIP's score for ``text`` when given; else the class logit picked (None: the top-1), or for a headless model
    the pooled vector's projection (None)."""
    return residual.target_for(ctx.lens, target_class, text or ())


def image_readout(ctx, target_class: int | None, text: str | None = None) -> residual.Readout:
    """The current image's direct readout (with each head's per-source shares)."""
    def compute(progress):
        with model_run():
            progress(0, 1)
            result = residual.readout(ctx.lens, [ctx.image.image], target_of(ctx, target_class, text))
        result.images = [ctx.image.name]
        return result
    return with_progress(("readout", ctx.spec, ctx.framing, ctx.image.sha256, target_class, text),
                         "Readout: splitting the target into its parts …", compute)


def set_textspan(ctx, k: int = 3):
    """TextSpan over the image set (:func:`vitviz.textspan`): each late head's top descriptions."""
    def compute(progress):
        with model_run():
            return vitviz.textspan(ctx.lens, [im.image for im in ctx.images], k=k, progress=progress)
    return with_progress(("textspan", ctx.spec, ctx.framing, tuple(im.sha256 for im in ctx.images), k),
                         "TextSpan: images", compute)


def set_logit_lens(ctx) -> residual.LogitLens:
    """The logit lens of every image of the set (the current image among them)."""
    def compute(progress):
        with model_run():
            progress(0, 1)
            result = residual.logit_lens(ctx.lens, [im.image for im in ctx.images])
        result.images = [im.name for im in ctx.images]
        return result
    return with_progress(("logit_lens", ctx.spec, ctx.framing, tuple(im.sha256 for im in ctx.images)),
                         "Logit lens: reading every block …", compute)


def image_patch_lens(ctx) -> residual.LogitLens:
    """The current image's logit lens per patch (every token of every block read alone), (1, L, N, C)."""
    def compute(progress):
        with model_run():
            progress(0, 1)
            return residual.logit_lens(ctx.lens, [ctx.image.image], per_patch=True)
    return with_progress(("patch_lens", ctx.spec, ctx.framing, ctx.image.sha256), "Logit lens per patch …", compute)


def set_tuned_lens(ctx) -> residual.TunedLens:
    """A tuned lens fitted on the image set (a quarter held out), and its held-out fit."""
    def compute(progress):
        with model_run():
            progress(0, 1)
            return residual.TunedLens.fit_images(ctx.lens, [im.image for im in ctx.images])
    return with_progress(("tuned_lens", ctx.spec, ctx.framing, tuple(im.sha256 for im in ctx.images)),
                         "Tuned lens: fitting one map per block …", compute)


def set_head_names(ctx, k: int = 3):
    """Each head's top classes over the image set (:func:`vitviz.residual.head_names`), one image at a time."""
    def compute(progress):
        lens = ctx.lens
        tables = []
        with model_run():
            for i, im in enumerate(ctx.images):
                progress(i, len(ctx.images))
                dv = residual.direct_vectors(lens, [im.image], point="logits")
                tables.append(dv.heads()[0])
        heads = np.mean(tables, axis=0)
        return residual.names_table(heads, lens.class_labels, k)
    return with_progress(("head_names", ctx.spec, ctx.framing, tuple(im.sha256 for im in ctx.images), k),
                         "Naming the heads: image", compute)


def names_grid(table):
    """The heads' names (:func:`set_head_names`) as a layers x heads table of "class (+value)", 1-based labels."""
    first = table[table["rank"] == 1].assign(text=lambda t: [f"{n} ({v:+.2g})" for n, v in zip(t.label, t.value)])
    shown = first.pivot(index="layer", columns="head", values="text")
    shown.index = [f"layer {l + 1}" for l in shown.index]
    shown.columns = [f"head {h + 1}" for h in shown.columns]
    return shown
