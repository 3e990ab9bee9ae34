"""The Features page's cached steps: the SAE read once per file version (or trained here, kept for the session), the
image set's latent codes once per (model, SAE, images). Every step names its SAE by an ``ident``: (path, file
version) for a file, ("trained", the zip's SHA-256) for one trained on the page."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from vitviz.errors import VitvizError
from vitviz.features.browse import Codes, encode_images
from vitviz.features.public import check_width, load_sae
from vitviz.features.sae import SAE
from vitviz.features.session import SizeCap, TrainedSAE, train_small
from vitviz.features.train import TrainSettings

from .cache import _model_run, model_run, store
from .model_box import APP_GIVE_A_HEAD

TRAINED = "features_trained"  # session key: the TrainedSAE trained on the page, kept for the session
CANCELLED = "features_train_cancelled"  # session key: the last training was cancelled


def _version(path: str) -> float:
    p = Path(path)
    files = [p / "sae.safetensors", p / "sae.json"] if p.is_dir() else [p]
    return max((f.stat().st_mtime for f in files if f.exists()), default=0.0)


@st.cache_resource(show_spinner=False, max_entries=4)
def _sae(path: str, version: float) -> SAE:
    return load_sae(path)


def sae_at(path: str) -> SAE:
    """The SAE in ``path`` (a features-train folder, a ViT-Prisma folder or a saev file), read once per version.

    Raises:
        VitvizError: nothing readable there (the sentence says what was looked for)."""
    if not Path(path).exists():
        raise VitvizError(f"{path}: no such file or folder.")
    return _sae(path, _version(path))


def path_ident(path: str) -> tuple:
    """The cache identity of the SAE at ``path``: the path and its files' modification time."""
    return (path, _version(path))


def checked_point(ctx, sae: SAE) -> str:
    """The SAE's point on the sidebar's model, its width checked (a sentence when it does not fit)."""
    kind, layer = sae.info.get("point_kind"), sae.info.get("layer")
    if not kind or not layer:
        raise VitvizError("this SAE does not say which point and layer it reads (sae.json: point_kind, layer).")
    check_width(sae, ctx.lens, kind, int(layer))
    return f"blocks.{int(layer) - 1}.{kind}"


def codes_of(ctx, sae: SAE, ident: tuple, point: str) -> Codes:
    """Latent codes of the sidebar's image set (shared between sessions, computed once)."""
    key = ("features", ctx.spec, ident, ctx.framing, tuple(im.sha256 for im in ctx.images))
    images = [im.image for im in ctx.images]
    return store().get_or_compute(key, _model_run(f"Encoding {len(images)} images with the SAE ...",
                                                  lambda: encode_images(ctx.lens, sae, images, point)))


def drivers_of(ctx, sae: SAE, ident: tuple):
    """Feature attribution of the current image's default target (top-1 logit, or the pooled vector's projection)."""
    from vitviz.features.splice import feature_attribution

    lens = ctx.lens
    key = ("features-drivers", ctx.spec, ident, ctx.image.sha256)
    return store().get_or_compute(key, _model_run("One backward pass through the spliced SAE ...", lambda: (
        feature_attribution(lens, lens.preprocess([ctx.image.image]), sae))))


def deletion_of(ctx, sae: SAE, ident: tuple, steps: int, seeds: int):
    """Concept deletion over the sidebar's image set (shared between sessions, computed once per settings)."""
    from vitviz.features.deletion import concept_deletion

    lens = ctx.lens
    key = ("features-deletion", ctx.spec, ident, ctx.framing, tuple(im.sha256 for im in ctx.images),
           steps, seeds)
    images = [im.image for im in ctx.images]
    return store().get_or_compute(key, _model_run(
        f"Concept deletion on {len(images)} images ({(steps + 1) * (seeds + 1)} forwards of the set) ...",
        lambda: concept_deletion(lens, lens.preprocess(images), sae, steps=steps, random_seeds=seeds,
                                 names=[im.name for im in ctx.images])))


def descriptions_of(ctx, sae: SAE, ident: tuple, latent: int, n: int = 5):
    """CLIP: the latent's ``n`` nearest descriptions (:func:`vitviz.features.classes.nearest_descriptions`), or None
    for a model without a text tower, or the sentence saying why there are none (a str)."""
    from vitviz.features.classes import nearest_descriptions, why_no_descriptions

    lens = ctx.lens
    if not lens.has_text:
        return None
    why = why_no_descriptions(lens, sae)
    if why:
        return why
    key = ("features-descriptions", ctx.spec, ident, latent, n)
    return store().get_or_compute(key, _model_run("Reading the latent's direction against words ...", lambda: (
        nearest_descriptions(lens, sae, [latent], n))))


def nearest_of(ctx, sae: SAE, ident: tuple, latent: int, n: int = 5):
    """The latent's ``n`` nearest classes (:func:`vitviz.features.classes.nearest_classes`) on the sidebar's model and
    head, or the sentence saying why there are none (a str)."""
    from vitviz.features.classes import nearest_classes, why_no_classes

    lens = ctx.lens
    why = why_no_classes(lens, sae, APP_GIVE_A_HEAD)
    if why:
        return why
    key = ("features-classes", ctx.spec, ident, latent, n)
    return store().get_or_compute(key, _model_run("Reading the latent's direction through the head ...", lambda: (
        nearest_classes(lens, sae, [latent], n))))


def _cancel() -> None:
    st.session_state[CANCELLED] = True


def train_here(ctx, images: list, settings: TrainSettings, cap: SizeCap) -> TrainedSAE:
    """``settings`` trained on ``images`` (:func:`vitviz.features.session.train_small`) under a progress bar that shows
    the explained variance, with a Cancel button, holding one of the server's run slots; the same model, framing,
    images and settings again are not trained twice (shared between sessions).

    A click on Cancel reruns the page, which stops the script inside the next progress update: nothing is kept."""
    key = ("features-train", ctx.spec, ctx.framing, tuple(im.sha256 for im in images), settings)

    st.session_state.pop(CANCELLED, None)

    def run() -> TrainedSAE:
        with model_run():
            stop = st.empty()
            stop.button("Cancel", key="features_train_cancel", on_click=_cancel, icon=":material/stop:")
            label = (f"Training {settings.latents} latents (k = {settings.topk}) on {len(images)} images "
                     + ("until converged" if settings.epochs is None else f"for {settings.epochs} epochs") + " ...")
            bar = st.progress(0.0, text=label)

            def progress(fraction: float, metrics: dict) -> None:
                bar.progress(fraction, text=f"{label} step {metrics['step']:,} · explained variance "
                                            f"{metrics['explained_variance']:.3f} · L0 {metrics['l0']:.1f}")

            trained = train_small(ctx.lens, images, settings, progress, cap)
            stop.empty()
            bar.empty()
            return trained

    return store().get_or_compute(key, run)
