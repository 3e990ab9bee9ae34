"""Registers: the high-norm outlier tokens and attention sinks that distort the maps, and their repair
(test-time register, Jiang et al. 2025; sink masking), before and after side by side."""
import streamlit as st

from ui.charts import file_stem, show_chart
from ui.display import display_in_use
from ui.downloads import download_row
from ui.guard import guarded
from ui.repair import faithfulness_view, offer_register
from ui.registers import before_after, cached_neuron_maps, cached_register, cached_search, cached_sink_masking
from ui.state import setup, view_applies
from ui.navigation import heading
from ui.words import counted, part_of
from vitviz.analyses.registers import OUTLIER_FACTOR, SEARCH_RULE, Repair, TestTimeRegister, outlier_rule
from vitviz.figures.registers_figures import maps_figure, norm_by_layer



ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
view_applies(ctx, "registers")
if ctx.lens.scope == "window":
    st.info(f"{ctx.lens.label} attends within shifted windows and has no prefix tokens: there is no register to add.")
    st.stop()
st.caption("Large ViTs write a few high-norm *outlier* tokens into background patches, and attention to them "
           "puts bright specks in the maps (Darcet et al. 2024). A handful of MLP neurons write them; moving those "
           "neurons' activation onto one extra token at test time (a *test-time register*, Jiang et al. 2025) cleans "
           "the maps without training. Attention *sinks* (patches that receive a disproportionate share of "
           "attention) are repaired by dropping them as keys instead.")

r, layout, loaded = ctx.result, ctx.result.layout, ctx.loaded
padding = display_in_use().padding  # hatched and kept out of the maps' scales, as the Display box on the map pages says
factor = st.slider("Outlier threshold (× the median patch-token norm of the image and layer)", 2.0, 20.0,
                   float(OUTLIER_FACTOR), 0.5, key="registers_factor")
search = cached_search(ctx.spec, tuple(im.sha256 for im in ctx.images), [im.image for im in ctx.images], factor)
out = search.outliers
current = [im.sha256 for im in ctx.images].index(ctx.image.sha256)
n_images = len(ctx.images)

st.subheader(f"Token norms by layer · {counted(n_images, 'image')} in the set")
ratio = out.largest_ratio_per_layer
with guarded("the token norms by layer"):
    stem = file_stem("norms_by_layer", f"{n_images}images")
    show_chart(norm_by_layer(out), "registers_norms", stem)
    st.caption(f"Rule: {outlier_rule(factor)}. Prefix tokens (CLS, trained registers, the test-time register) are "
               "drawn apart from the patches and never count as outliers. Largest patch norm / median per layer, over "
               f"the set: {' · '.join(f'{i + 1}: {v:.2f}' for i, v in enumerate(ratio))}.")
    download_row(stem, {"norms": out.norms, "median": out.median, "outlier_mask": out.mask},
                 {"images": [im.name for im in ctx.images], "rule": outlier_rule(factor), "model": loaded.card()["spec"],
                  "axes": "norms[image, layer - 1, token] (0-based arrays; tokens: prefix then patches in raster order)"})

if not out.any:
    st.info(f"**No outliers: nothing to repair.** No patch token's norm exceeds {factor:g}× the median in any layer "
            f"of the {counted(n_images, 'image')} (the largest is {ratio.max():.2f}× the median). "
            "What distorts this model's maps is attention sinks: sink masking below drops them as keys.")
else:
    emergence = out.emergence_layer
    st.subheader("Outliers on the image")
    detect = search.detect_layer
    patches = out.positions(detect)[current]
    norms_map = out.norm_map(current, detect)
    fig, caption = maps_figure(r.model_input, norms_map, [f"layer {detect + 1} output norm"], layout,
                               f"Outlier patches of layer {detect + 1} (crossed): {len(patches)}",
                               value_name="norm", marked=patches, columns=1, tile_px=300, marked_what="outliers",
                               padding=padding)
    show_chart(fig, "registers_outliers", file_stem("outliers", ctx.image.name))
    st.caption(f"{caption} Outliers emerge in layer {emergence + 1} "
               f"({part_of(int(out.images_per_layer[emergence]), n_images, 'image')} one there).")

    st.subheader("Register neurons")
    if not search.neurons:
        # Outliers somewhere, none in the detection layer: no position to score the neurons at.
        layers = [i + 1 for i in out.layers_with_outliers]
        repaired = (f"No image of the set has an outlier in layer {detect + 1}, the layer whose outliers are the "
                    "positions the neurons are scored at, so no register neuron is ranked and there is no test-time "
                    f"register to try. At {factor:g}× the median, outliers appear only in layer"
                    f"{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}: raise the threshold to keep "
                    "only the tokens Darcet et al. call outliers (about 10×).")
        st.info(repaired)
    else:
        st.caption(f"Search: {SEARCH_RULE}. Positions: the outliers of layer {detect + 1}; "
                   f"{part_of(search.images_with_outliers, n_images, 'image')} some.")
        k_show = min(8, len(search.neurons))
        top = search.neurons[:k_show]
        st.dataframe([{"rank": i + 1, "layer": n.layer + 1, "unit": n.index, "score (mean |activation|)": round(n.score, 3)}
                      for i, n in enumerate(top)], hide_index=True)
        with guarded("the register neurons' maps"):
            acts = cached_neuron_maps(ctx.spec, ctx.image.sha256, ctx.image.image, top,
                                      tuple((n.layer, n.index) for n in top))
            fig, caption = maps_figure(r.model_input, acts, [f"#{i + 1}: layer {n.layer + 1}, unit {n.index}"
                                                             for i, n in enumerate(top)], layout,
                                       "Activation of the top register neurons on this image", value_name="activation",
                                       shared=False, columns=4, tile_px=220)
            show_chart(fig, "registers_neurons", file_stem("register_neurons", ctx.image.name))
            st.caption(f"{caption} Each neuron's hidden unit after the activation, in its own layer; this image's outliers "
                       f"(layer {detect + 1}): patches {patches.tolist()}.")

        st.subheader("Test-time register: before and after")
        c = st.columns(2)
        k = c[0].slider("Neurons moved onto the register", 1, min(len(search.neurons), 50), min(10, len(search.neurons)),
                        key="registers_k")
        init = c[1].radio("The extra token starts as", ["zero", "mean"], horizontal=True, key="registers_init",
                          help="zero: as Jiang et al.'s code; mean: the mean of the patch tokens entering block 1")
        repaired = cached_register(ctx.spec, ctx.image.sha256, ctx.image.image,
                                   tuple((n.layer, n.index) for n in search.neurons[:k]), init)
        offer_register(ctx.spec, [(n.layer, n.index) for n in search.neurons[:k]],
                       f"the Registers page's search ({counted(n_images, 'image')}, best {k})")
        if isinstance(repaired, str):
            st.info(repaired)
        else:
            _before_after = repaired


if out.any and not isinstance(repaired, str):
    before_after(ctx, "test-time register", _before_after, "register", patches, f"the outliers of layer {detect + 1}",
                 padding)
    faithfulness_view(ctx, Repair("register", TestTimeRegister(tuple((n.layer, n.index) for n in search.neurons[:k]),
                                                               init)), "register")

st.subheader("Sink masking: before and after")
sinks = r.sinks.patch_counts(layout)
st.caption("Each layer's patch sinks (a robust z-score above 8 and at least 10× the uniform share of attention) "
           "dropped as keys in that layer, every row renormalised, and the forward run on, so the output changes "
           "too (the analyses' *exclude sinks* drops the same tokens from the maps only). Patch sinks per layer on "
           f"this image: {' '.join(str(n) for n in sinks)}.")
if sum(sinks) == 0:
    st.info("No patch sinks in any layer of this image: nothing to mask.")
else:
    before_after(ctx, "sink masking", cached_sink_masking(ctx.spec, ctx.image.sha256, ctx.image.image, r), "sinks",
                 r.sinks.patch_sinks(layout), "attention sinks", padding)
    faithfulness_view(ctx, Repair("sinks"), "sinks")
