"""Features: a sparse autoencoder's latents on the current image and across the image set."""
from dataclasses import replace

import streamlit as st

from ui import keys
from ui.attribution import target_title
from ui.cache import operator_settings
from ui.charts import file_stem, show_chart
from ui.display import patch_picker
from ui.features import (CANCELLED, TRAINED, checked_point, codes_of, deletion_of, descriptions_of, drivers_of,
                         nearest_of, path_ident, sae_at, train_here)
from ui.guard import guarded
from ui.state import sample_set, setup
from ui.navigation import heading
from vitviz.errors import VitvizError
from vitviz.features.sae import Convergence
from vitviz.features.figures import (activation_histogram, deletion_figure, image_latents_figure,
                                     latent_patches_figure, latent_scores_figure)
from vitviz.features.session import (DEFAULT_LATENTS, DEFAULT_TOPK, SHARED_CAP, SizeCap,
                                     default_layer, default_settings)
from vitviz.sources.preprocess import preprocess

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
shared = operator_settings().shared
cap = SHARED_CAP if shared else SizeCap()  # a shared server's size cap on what one request trains
st.caption("A sparse autoencoder (SAE) splits one layer's patch tokens into many latents, few active per token "
           "(TopK, Gao et al. 2024). Train one here on the sidebar's images (below), or on more images with "
           "`python -m vitviz features train INPUT... --layer L --latents K --topk k --out DIR`"
           + ("." if shared else ", and give its folder, a saev checkpoint or a ViT-Prisma folder below.")
           + " Latents are numbered from 0, as in the files; patches as on every page: patch 147 (row 10, col 4), "
           "numbered from 0, rows and columns from 1.")

trained = st.session_state.get(TRAINED)
with st.expander("Train an SAE here", expanded=trained is None, key="features_train_box"), guarded("the SAE training"):
    lens = ctx.lens
    samples = sample_set(ctx)
    extra = [im for im in samples if im.sha256 not in {i.sha256 for i in ctx.images}]
    t1, t2, t3, t4 = st.columns(4)
    layer = t1.number_input("Layer (1-based)", 1, lens.num_layers, default_layer(lens.num_layers),
                            key="features_train_layer", help="The block whose output (resid_post) the SAE reads.")
    widths = [w for w in (64, 128, 256, 512, 1024, 2048, 4096) if cap.latents is None or w <= cap.latents]
    latents = t2.select_slider("Latents (width)", widths, DEFAULT_LATENTS, key="features_train_latents",
                               help="How many directions the SAE learns.")
    topk = t3.number_input("k (active per token)", 1, 64, DEFAULT_TOPK, key="features_train_topk",
                           help="TopK: each patch token is rebuilt from its k strongest latents.")
    until = t4.checkbox("Until it converges", True, key="features_train_until",
                        help=f"Train until the explained variance stops rising (at least {Convergence().min_steps:,} "
                             "steps); off: a fixed number of epochs.")
    epochs = t4.number_input("Epochs", 1, cap.epochs or 500, 50, key="features_train_epochs", disabled=until,
                             help="Passes over the images' tokens (the model runs once; the tokens are kept).",
                             label_visibility="collapsed")
    add = st.checkbox(f"Also the other bundled sample photos ({len(extra)})", bool(extra), key="features_train_samples",
                      disabled=not extra, help="Training on more images gives latents that mean more than one photo.")
    images = list(ctx.images) + (extra if add else [])
    st.caption(f"Trains on {len(images)} images (the sidebar's {len(ctx.images)}"
               + (f" and {len(extra)} sample photos" if add and extra else "") + "); "
               f"the defaults reach an explained variance of about 0.95 on two to four photos in under a minute on "
               "a CPU."
               + (f" This server trains at most {cap.text()} at once." if shared else ""))
    if st.button("Train", type="primary", key="features_train"):
        settings = replace(default_settings(lens, int(layer)), latents=int(latents), topk=int(topk),
                           epochs=None if until else int(epochs))
        trained = st.session_state[TRAINED] = train_here(ctx, images, settings, cap)
    elif st.session_state.get(CANCELLED):
        st.info("Training cancelled: nothing was kept.")
if trained is not None:
    m = trained.sae.info["metrics"]
    done, download = st.columns([4, 1], vertical_alignment="center")
    done.success(f"Trained here: {trained.sae.latents} latents, k = {trained.sae.topk}, layer "
                 f"{trained.sae.info['layer']}, {trained.sae.info['images']['count']} images; explained variance "
                 f"{m['explained_variance']:.3f}, L0 {m['l0']:.1f}, dead {m['dead_fraction']:.1%} after "
                 f"{trained.sae.info['training']['steps']:,} steps"
                 + (", converged." if trained.sae.info["training"].get("stop_reason") == "plateau" else "."))
    download.download_button("Download (zip)", trained.zip, f"{trained.folder}.zip", "application/zip",
                             key="features_train_download", on_click="ignore", icon=":material/download:",
                             help="The folder `features train` writes (sae.safetensors, sae.json); unzipped, give it "
                                  + ("to `features top` or vitviz.load_sae." if shared else
                                     "to the box below, `features top` or vitviz.load_sae."))

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
    st.stop()
try:
    if use_trained:
        sae, ident = trained.sae, ("trained", trained.sha256)
    else:
        sae, ident = sae_at(path), path_ident(path)
    point = checked_point(ctx, sae)
except VitvizError as exc:
    st.error(str(exc))
    st.stop()
trained_on = (sae.info.get("model") or {}).get("name")
if trained_on and trained_on != ctx.spec.name:
    st.warning(f"This SAE was trained on {trained_on!r}; the sidebar's model is {ctx.spec.name!r}. The widths match, "
               "but its latents mean what they meant on its own model only.")
metrics = sae.info.get("metrics") or {}
st.caption(f"{sae.latents} latents, k = {sae.topk or 'ReLU (no top k)'}, reading {sae.info.get('point_kind')} of "
           f"layer {sae.info.get('layer')}"
           + (f"; training: explained variance {metrics['explained_variance']:.3f}, L0 {metrics['l0']:.1f}, "
              f"dead {metrics['dead_fraction']:.1%}" if "explained_variance" in metrics else "") + ".")
not_converged = (sae.info.get("training") or {}).get("warning")
if not_converged:
    st.warning(f"Its training did not converge: {not_converged}")

codes = codes_of(ctx, sae, ident, point)
index = [im.name for im in ctx.images].index(ctx.image.name)
layout = ctx.result.layout

st.subheader("Top latents of this image")
c1, c2 = st.columns([1, 1])
by = c1.radio("Rank latents by", ["max", "sum"], horizontal=True, key="features_by",
              help="max: the strongest patch; sum: the activation summed over the patches (how much of the image).")
n = c2.slider("Latents shown", 4, 16, 8, step=4, key="features_n")
top = codes.top_latents(index, n, by)
if not len(top):
    st.info("No latent fires on this image's patches.")
    st.stop()
maps = codes.image_maps(index)[top]
show_chart(image_latents_figure(ctx.result.model_input, maps, [int(j) for j in top], layout),
           "features_image", file_stem("features", ctx.image.name, by))

st.subheader("Which latents fire at a patch")
gh, gw = layout.grid_size
clicked = st.session_state.get(keys.PATCH)  # shared with the other pages that pick patches
# before any click: the strongest patch of the image's top latent
patch = int(maps[0].argmax()) if clicked is None or clicked >= gh * gw else int(clicked)
pick, listed = st.columns([1, 2])
with pick:
    patch_picker(ctx.result.model_input, layout, "features_patch_click", shown=patch)
firing = codes.patch_latents(index, patch)


def _open(latent: int) -> None:
    st.session_state["features_latent"] = latent


with listed:
    st.markdown(f"**{layout.token_name(patch + layout.num_prefix_tokens).capitalize()}**: "
                f"{len(firing)} latents fire there, strongest first. Click one to open it below.")
    if not firing:
        st.caption("No latent fires at this patch.")
    for row in range(0, len(firing), 3):
        for cell, (j, v) in zip(st.columns(3), firing[row:row + 3]):
            cell.button(f"latent {j} · {v:.3g}", key=f"features_open_{j}", on_click=_open, args=(j,),
                        width="stretch", help=f"activation {v:.4g} (SAE units) at this patch")
    st.caption("Click the image to pick another patch (the outlined one is shown); activations in the SAE's units.")

st.subheader("One latent across the image set")
choices = list(dict.fromkeys([int(j) for j in top] + [j for j, _ in firing]))
if st.session_state.get("features_latent") not in choices and "features_latent" in st.session_state:
    choices.append(int(st.session_state["features_latent"]))
latent = int(st.selectbox("Latent", choices, key="features_latent",
                          help="This image's top latents and those firing at the clicked patch; its strongest patches "
                               "over every image in the sidebar's set."))
rows = codes.top_patches(latent, n=8)
if rows:
    by_name = {im.name: im for im in ctx.images}
    names = [ctx.images[i].name for i, _, _ in rows]
    inputs = preprocess([by_name[nm].image for nm in names], ctx.loaded.data_config).images
    latent_maps = codes.latent_maps(latent)[[i for i, _, _ in rows]]
    show_chart(latent_patches_figure(inputs, latent_maps, [p for _, p, _ in rows], [a for _, _, a in rows], names,
                                     latent, layout), "features_latent_patches", file_stem("features_latent", latent))
    tokens = codes.values.shape[0] * codes.values.shape[1]
    show_chart(activation_histogram(codes.activations(latent), latent, codes.frequency(latent), tokens),
               "features_histogram", file_stem("features_histogram", latent))
    st.caption(f"Over the {len(ctx.images)} images of the sidebar's set ({tokens} patch tokens).")
else:
    st.info(f"Latent {latent} fires on none of the {len(ctx.images)} images of the sidebar's set.")

st.markdown(f"**Latent {latent}: nearest classes of its decoder direction**")
near = nearest_of(ctx, sae, ident, latent)
if isinstance(near, str):
    st.info(near)
else:
    st.dataframe({"rank": near["rank"].tolist(), "class": near["label"].tolist(),
                  "class index (0-based)": near["class"].tolist(), "cosine": [round(c, 4) for c in near.cosine]},
                 hide_index=True, key="features_classes")
    st.caption("Cosine of the latent's decoder row with each class's readout direction: the gradient of the class's "
               "logit with respect to a shift added to every token, through the final norm (its spread held constant), "
               "the pooling and the head — a logit lens: the blocks after the SAE's layer are skipped, so this is what "
               "the direction says to the head, not what the model does with it downstream (that is the next section).")

words = descriptions_of(ctx, sae, ident, latent)
if isinstance(words, str):
    st.info(words)
elif words is not None:
    st.markdown(f"**Latent {latent}: nearest descriptions of its decoder direction (CLIP)**")
    st.dataframe({"rank": words["rank"].tolist(), "description": words["text"].tolist(),
                  "cosine": [round(c, 4) for c in words.cosine]}, hide_index=True, key="features_descriptions")
    st.caption("Cosine of the latent's decoder row with each description's readout direction: the gradient of "
               "⟨visual_projection(pooled), text embedding⟩ with respect to a shift added to every token (the final "
               "norm's spread held constant), over vitviz's own descriptions.")

st.subheader("Which latents drive the output")
if st.toggle("Compute: one backward pass through the SAE spliced in", key="features_drivers"):
    fa = drivers_of(ctx, sae, ident)
    show_chart(latent_scores_figure(fa.scores[0], target_title(fa.target)), "features_drivers_fig",
               file_stem("features_drivers", ctx.image.name))
    st.caption(f"Score of a latent = its activation × the gradient of {target_title(fa.target)} with respect to it, summed "
               "over the patches, with the SAE spliced in at its point and its reconstruction error kept as a constant "
               "(the output is exactly the model's own).")

st.subheader("Concept deletion over the image set")
d1, d2, d3 = st.columns([2, 1, 1])
steps = d2.number_input("Latents zeroed, up to", 1, 32, 6, key="features_del_steps")
seeds = d3.number_input("Random seeds", 1, 10, 3, key="features_del_seeds")
if d1.toggle("Compute: zero the top latents one more at a time", key="features_deletion"):
    d = deletion_of(ctx, sae, ident, int(steps), int(seeds))
    show_chart(deletion_figure(d.curves, d.target_text), "features_deletion_fig",
               file_stem("features_deletion", len(ctx.images)))
    st.caption(d.sentence + f" Per image the latents are ranked by their score above; random latents are drawn from "
               f"those active on the image; the interval is a percentile bootstrap over the {len(ctx.images)} images "
               "(10,000 resamples).")

