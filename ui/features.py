"""The Features page's cached steps: the SAE read once per file version (or trained here, kept for the session), the
image set's latent codes once per (model, SAE, images). Every step names its SAE by an ``ident``: (path, file
version) for a file, ("trained", the zip's SHA-256) for one trained on the page."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st

from vitviz.errors import VitvizError
from vitviz.features.browse import Codes, encode_images
from vitviz.features.figures import (activation_histogram, deletion_figure, image_latents_figure,
                                     latent_patches_figure, latent_scores_figure)
from vitviz.features.public import check_width, load_sae
from vitviz.features.sae import SAE, Convergence
from vitviz.features.session import (DEFAULT_LATENTS, DEFAULT_TOPK, SHARED_CAP, SizeCap, TrainedSAE, default_layer,
                                     default_settings, train_small)
from vitviz.features.train import TrainSettings
from vitviz.sources.preprocess import preprocess

from . import keys
from .attribution import target_title
from .cache import _model_run, model_run, operator_settings, store
from .charts import file_stem, show_chart
from .display import patch_picker
from .guard import guarded
from .model_box import APP_GIVE_A_HEAD
from .state import sample_set
from .words import counted, subject

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
    return store().get_or_compute(key, _model_run(f"Encoding {counted(len(images), 'image')} with the SAE ...",
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
        f"Concept deletion on {counted(len(images), 'image')} ({(steps + 1) * (seeds + 1)} forwards of the set) ...",
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
            label = (f"Training {settings.latents} latents (k = {settings.topk}) on {counted(len(images), 'image')} "
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


# ---- The page's sections -------------------------------------------------------------------------------------------

def size_cap() -> SizeCap:
    """What one request may train: a shared server's cap, or none."""
    return SHARED_CAP if operator_settings().shared else SizeCap()


def intro() -> None:
    """What an SAE is, where one comes from, and how latents and patches are numbered."""
    shared = operator_settings().shared
    st.caption("A sparse autoencoder (SAE) splits one layer's patch tokens into many latents, few active per token "
               "(TopK, Gao et al. 2024). Train one here on the sidebar's images (below), or on more images with "
               "`python -m vitviz features train INPUT... --layer L --latents K --topk k --out DIR`"
               + ("." if shared else ", and give its folder, a saev checkpoint or a ViT-Prisma folder below.")
               + " Latents are numbered from 0, as in the files; patches as on every page: patch 147 (row 10, col 4), "
               "numbered from 0, rows and columns from 1.")


def training_caption(images: int, sidebar: int, extra: int, cap: SizeCap | None) -> str:
    """What the Train button trains on, in words ("Trains on 3 images (the sidebar's 1 and 2 sample photos)"), and
    the server's cap (``cap``: None on a private server)."""
    return (f"Trains on {counted(images, 'image')} (the sidebar's {sidebar}"
            + (f" and {counted(extra, 'sample photo')}" if extra else "") + "); "
            "the defaults reach an explained variance of about 0.95 on two to four photos in under a minute on a CPU."
            + (f" This server trains at most {cap.text()} at once." if cap is not None else ""))


def extra_label(extra: int) -> str:
    """The checkbox adding the bundled sample photos the sidebar does not hold."""
    return ("Also the other bundled sample photo" if extra == 1 else
            f"Also the {extra} other bundled sample photos" if extra else "Also the other bundled sample photos")


def _trained_line(trained: TrainedSAE) -> str:
    info, m = trained.sae.info, trained.sae.info["metrics"]
    return (f"Trained here: {trained.sae.latents} latents, k = {trained.sae.topk}, layer {info['layer']}, "
            f"{counted(info['images']['count'], 'image')}; explained variance {m['explained_variance']:.3f}, "
            f"L0 {m['l0']:.1f}, dead {m['dead_fraction']:.1%} after {info['training']['steps']:,} steps"
            + (", converged." if info["training"].get("stop_reason") == "plateau" else "."))


def train_section(ctx) -> TrainedSAE | None:
    """The "Train an SAE here" box (open until one is trained) and, once trained, its summary and download. Returns
    the SAE trained in this session, or None."""
    shared, cap = operator_settings().shared, size_cap()
    trained = st.session_state.get(TRAINED)
    with st.expander("Train an SAE here", expanded=trained is None, key="features_train_box"), \
            guarded("the SAE training"):
        lens = ctx.lens
        extra = [im for im in sample_set(ctx) if im.sha256 not in {i.sha256 for i in ctx.images}]
        t1, t2, t3, t4 = st.columns(4)
        layer = t1.number_input("Layer (1-based)", 1, lens.num_layers, default_layer(lens.num_layers),
                                key="features_train_layer", help="The block whose output (resid_post) the SAE reads.")
        widths = [w for w in (64, 128, 256, 512, 1024, 2048, 4096) if cap.latents is None or w <= cap.latents]
        latents = t2.select_slider("Latents (width)", widths, DEFAULT_LATENTS, key="features_train_latents",
                                   help="How many directions the SAE learns.")
        topk = t3.number_input("k (active per token)", 1, 64, DEFAULT_TOPK, key="features_train_topk",
                               help="TopK: each patch token is rebuilt from its k strongest latents.")
        until = t4.checkbox("Until it converges", True, key="features_train_until",
                            help="Train until the explained variance stops rising (at least "
                                 f"{Convergence().min_steps:,} steps); off: a fixed number of epochs.")
        epochs = t4.number_input("Epochs", 1, cap.epochs or 500, 50, key="features_train_epochs", disabled=until,
                                 help="Passes over the images' tokens (the model runs once; the tokens are kept).",
                                 label_visibility="collapsed")
        add = st.checkbox(extra_label(len(extra)), bool(extra), key="features_train_samples", disabled=not extra,
                          help="Training on more images gives latents that mean more than one photo.")
        images = list(ctx.images) + (extra if add else [])
        st.caption(training_caption(len(images), len(ctx.images), len(extra) if add else 0, cap if shared else None))
        if st.button("Train", type="primary", key="features_train"):
            settings = replace(default_settings(lens, int(layer)), latents=int(latents), topk=int(topk),
                               epochs=None if until else int(epochs))
            trained = st.session_state[TRAINED] = train_here(ctx, images, settings, cap)
        elif st.session_state.get(CANCELLED):
            st.info("Training cancelled: nothing was kept.")
    if trained is not None:
        done, download = st.columns([4, 1], vertical_alignment="center")
        done.success(_trained_line(trained))
        download.download_button("Download (zip)", trained.zip, f"{trained.folder}.zip", "application/zip",
                                 key="features_train_download", on_click="ignore", icon=":material/download:",
                                 help="The folder `features train` writes (sae.safetensors, sae.json); unzipped, give "
                                      "it " + ("to `features top` or vitviz.load_sae." if shared else
                                               "to the box below, `features top` or vitviz.load_sae."))
    return trained


@dataclass
class ChosenSAE:
    """The SAE the page shows, its cache identity (see the module's docstring) and the point it reads."""
    sae: SAE
    ident: tuple
    point: str


def choose_sae(ctx, trained: TrainedSAE | None) -> ChosenSAE | None:
    """The SAE trained here or the one at a typed path (a private server only), checked against the sidebar's model;
    None when there is none, or the sentence why it does not fit shown."""
    shared = operator_settings().shared
    path = "" if shared else st.text_input("SAE (a features train folder, a ViT-Prisma folder or a saev file)",
                                           key="features_sae", placeholder="runs/sae").strip()
    if path and trained is not None:
        use_trained = st.radio("SAE shown", ["the one trained here", "the one at the path"], horizontal=True,
                               key="features_source") == "the one trained here"
    else:
        use_trained = trained is not None
    if not path and not use_trained:
        st.info("Give an SAE above (" + ("train one" if shared else "train one, or type its path") + ") to see its "
                "latents on the current image and across the image set.")
        return None
    try:
        sae, ident = (trained.sae, ("trained", trained.sha256)) if use_trained else (sae_at(path), path_ident(path))
        return ChosenSAE(sae, ident, checked_point(ctx, sae))
    except VitvizError as exc:
        st.error(str(exc))
        return None


def about_sae(ctx, sae: SAE) -> None:
    """The SAE in one line (width, k, point, training metrics), and warnings: another model's SAE, not converged."""
    trained_on = (sae.info.get("model") or {}).get("name")
    if trained_on and trained_on != ctx.spec.name:
        st.warning(f"This SAE was trained on {trained_on!r}; the sidebar's model is {ctx.spec.name!r}. The widths "
                   "match, but its latents mean what they meant on its own model only.")
    metrics = sae.info.get("metrics") or {}
    st.caption(f"{sae.latents} latents, k = {sae.topk or 'ReLU (no top k)'}, reading {sae.info.get('point_kind')} of "
               f"layer {sae.info.get('layer')}"
               + (f"; training: explained variance {metrics['explained_variance']:.3f}, L0 {metrics['l0']:.1f}, "
                  f"dead {metrics['dead_fraction']:.1%}" if "explained_variance" in metrics else "") + ".")
    not_converged = (sae.info.get("training") or {}).get("warning")
    if not_converged:
        st.warning(f"Its training did not converge: {not_converged}")


@dataclass
class TopLatents:
    """The current image's index in the set, its top latents, and their maps ((n, gh, gw), in the SAE's units)."""
    index: int
    latents: list[int]
    maps: object


def top_section(ctx, codes: Codes) -> TopLatents | None:
    """The current image's strongest latents, each as a map over its patches; None (said) when none fires."""
    index = [im.name for im in ctx.images].index(ctx.image.name)
    st.subheader("Top latents of this image")
    c1, c2 = st.columns([1, 1])
    by = c1.radio("Rank latents by", ["max", "sum"], horizontal=True, key="features_by",
                  help="max: the strongest patch; sum: the activation summed over the patches (how much of the image).")
    n = c2.slider("Latents shown", 4, 16, 8, step=4, key="features_n")
    top = codes.top_latents(index, n, by)
    if not len(top):
        st.info("No latent fires on this image's patches.")
        return None
    maps = codes.image_maps(index)[top]
    latents = [int(j) for j in top]
    show_chart(image_latents_figure(ctx.result.model_input, maps, latents, ctx.result.layout),
               "features_image", file_stem("features", ctx.image.name, by))
    return TopLatents(index, latents, maps)


def _open(latent: int) -> None:
    st.session_state["features_latent"] = latent


def firing_sentence(name: str, firing: int) -> str:
    """Above the latents firing at a patch: "Patch 3 (row 1, col 4): 1 latent fires there, strongest first." """
    return (f"**{name}**: {subject(firing, 'latent', ('fires', 'fire'))} there, strongest first. Click one to open "
            "it below.")


def patch_section(ctx, codes: Codes, top: TopLatents) -> list[tuple[int, float]]:
    """The latents firing at a clicked patch (before a click: the strongest patch of the image's top latent), each a
    button that opens it below. Returns them as (latent, activation), strongest first."""
    layout = ctx.result.layout
    st.subheader("Which latents fire at a patch")
    gh, gw = layout.grid_size
    clicked = st.session_state.get(keys.PATCH)  # shared with the other pages that pick patches
    patch = codes.strongest_patch(top.index, top.latents[0]) if clicked is None or clicked >= gh * gw else int(clicked)
    pick, listed = st.columns([1, 2])
    with pick:
        patch_picker(ctx.result.model_input, layout, "features_patch_click", shown=patch)
    firing = codes.patch_latents(top.index, patch)
    with listed:
        st.markdown(firing_sentence(layout.token_name(patch + layout.num_prefix_tokens).capitalize(), len(firing)))
        if not firing:
            st.caption("No latent fires at this patch.")
        for row in range(0, len(firing), 3):
            for cell, (j, v) in zip(st.columns(3), firing[row:row + 3]):
                cell.button(f"latent {j} · {v:.3g}", key=f"features_open_{j}", on_click=_open, args=(j,),
                            width="stretch", help=f"activation {v:.4g} (SAE units) at this patch")
        st.caption("Click the image to pick another patch (the outlined one is shown); activations in the SAE's "
                   "units.")
    return firing


def latent_section(ctx, codes: Codes, top: TopLatents, firing: list[tuple[int, float]]) -> int:
    """One latent (the image's top ones, those firing at the patch, or one opened before) over the whole image set:
    its strongest patches and the histogram of its activations. Returns the latent."""
    st.subheader("One latent across the image set")
    choices = list(dict.fromkeys(top.latents + [j for j, _ in firing]))
    if st.session_state.get("features_latent") not in choices and "features_latent" in st.session_state:
        choices.append(int(st.session_state["features_latent"]))
    latent = int(st.selectbox("Latent", choices, key="features_latent",
                              help="This image's top latents and those firing at the clicked patch; its strongest "
                                   "patches over every image in the sidebar's set."))
    rows = codes.top_patches(latent, n=8)
    images = counted(len(ctx.images), "image")
    if not rows:
        st.info(f"Latent {latent} fires on none of the {images} of the sidebar's set.")
        return latent
    by_name = {im.name: im for im in ctx.images}
    names = [ctx.images[i].name for i, _, _ in rows]
    inputs = preprocess([by_name[nm].image for nm in names], ctx.loaded.data_config).images
    latent_maps = codes.latent_maps(latent)[[i for i, _, _ in rows]]
    show_chart(latent_patches_figure(inputs, latent_maps, [p for _, p, _ in rows], [a for _, _, a in rows], names,
                                     latent, ctx.result.layout),
               "features_latent_patches", file_stem("features_latent", latent))
    tokens = codes.values.shape[0] * codes.values.shape[1]
    show_chart(activation_histogram(codes.activations(latent), latent, codes.frequency(latent), tokens),
               "features_histogram", file_stem("features_histogram", latent))
    st.caption(f"Over the {images} of the sidebar's set ({counted(tokens, 'patch token')}).")
    return latent


def words_section(ctx, chosen: ChosenSAE, latent: int) -> None:
    """The latent's decoder direction read through the head (nearest classes) and, for CLIP, against words."""
    sae, ident = chosen.sae, chosen.ident
    st.markdown(f"**Latent {latent}: nearest classes of its decoder direction**")
    near = nearest_of(ctx, sae, ident, latent)
    if isinstance(near, str):
        st.info(near)
    else:
        st.dataframe({"rank": near["rank"].tolist(), "class": near["label"].tolist(),
                      "class index (0-based)": near["class"].tolist(), "cosine": [round(c, 4) for c in near.cosine]},
                     hide_index=True, key="features_classes")
        st.caption("Cosine of the latent's decoder row with each class's readout direction: the gradient of the "
                   "class's logit with respect to a shift added to every token, through the final norm (its spread "
                   "held constant), the pooling and the head — a logit lens: the blocks after the SAE's layer are "
                   "skipped, so this is what the direction says to the head, not what the model does with it "
                   "downstream (that is the next section).")
    words = descriptions_of(ctx, sae, ident, latent)
    if isinstance(words, str):
        st.info(words)
    elif words is not None:
        st.markdown(f"**Latent {latent}: nearest descriptions of its decoder direction (CLIP)**")
        st.dataframe({"rank": words["rank"].tolist(), "description": words["text"].tolist(),
                      "cosine": [round(c, 4) for c in words.cosine]}, hide_index=True, key="features_descriptions")
        st.caption("Cosine of the latent's decoder row with each description's readout direction: the gradient of "
                   "⟨visual_projection(pooled), text embedding⟩ with respect to a shift added to every token (the "
                   "final norm's spread held constant), over vitviz's own descriptions.")


def drivers_section(ctx, chosen: ChosenSAE) -> None:
    """On a toggle: each latent's contribution to the output (activation × gradient, the SAE spliced in)."""
    st.subheader("Which latents drive the output")
    if not st.toggle("Compute: one backward pass through the SAE spliced in", key="features_drivers"):
        return
    fa = drivers_of(ctx, chosen.sae, chosen.ident)
    show_chart(latent_scores_figure(fa.scores[0], target_title(fa.target)), "features_drivers_fig",
               file_stem("features_drivers", ctx.image.name))
    st.caption(f"Score of a latent = its activation × the gradient of {target_title(fa.target)} with respect to it, "
               "summed over the patches, with the SAE spliced in at its point and its reconstruction error kept as a "
               "constant (the output is exactly the model's own).")


def deletion_section(ctx, chosen: ChosenSAE) -> None:
    """On a toggle: the output as the top latents are zeroed one more at a time, against random latents."""
    st.subheader("Concept deletion over the image set")
    d1, d2, d3 = st.columns([2, 1, 1])
    steps = d2.number_input("Latents zeroed, up to", 1, 32, 6, key="features_del_steps")
    seeds = d3.number_input("Random seeds", 1, 10, 3, key="features_del_seeds")
    if not d1.toggle("Compute: zero the top latents one more at a time", key="features_deletion"):
        return
    d = deletion_of(ctx, chosen.sae, chosen.ident, int(steps), int(seeds))
    show_chart(deletion_figure(d.curves, d.target_text), "features_deletion_fig",
               file_stem("features_deletion", len(ctx.images)))
    st.caption(d.sentence + " Per image the latents are ranked by their score above; random latents are drawn from "
               "those active on the image; the interval is a percentile bootstrap over the "
               f"{counted(len(ctx.images), 'image')} (10,000 resamples).")
