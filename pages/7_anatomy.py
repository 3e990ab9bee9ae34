"""Attention anatomy: one query's attention in one head, step by step, with this image's numbers."""
import streamlit as st

from ui import keys
from ui.charts import file_stem, show_chart
from ui.display import display_controls, map_figure, panel_download, patch_picker
from ui.downloads import download_row
from ui.explain import cached_layer_qkv
from ui.state import view_applies, setup
from ui.navigation import heading
from vitviz.analyses.anatomy import attention_anatomy, span
from vitviz.errors import VitvizError
from vitviz.figures.explain_figures import (contributions_figure, score_map_figure, softmax_figure, sorted_scores_figure,
                                    vector_figure)

TOP = 10

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
view_applies(ctx, "anatomy")
r, layout = ctx.result, ctx.result.layout
L, H = r.attention.shape[:2]
st.caption("One row of one attention head, computed step by step as the articles write it — "
           "softmax(q·kᵀ / √d) V — with the model's own numbers for this image. The queries, keys and values are "
           "recomputed from the block's input with the block's own layers, so the row below is the row the "
           "heads page shows. Position terms inside attention are included as the model computes them: a rotary "
           "embedding (EVA-02, rotary ViTs) is already in q and k; a relative position bias (BEiT) is added to "
           "the scaled scores in step 3.")

controls, picker, first = st.columns([1, 0.9, 1.7])
with controls:
    layer = st.slider("Layer", 1, L, L, key="anatomy_layer") - 1
    head = st.selectbox("Head", list(range(1, H + 1)), key="anatomy_head") - 1
    queries = (["CLS"] if layout.has_class_token else []) + ["clicked patch"]
    query_label = st.radio("Query token", queries, key="anatomy_query", horizontal=True)
    display = display_controls()
with picker:
    # The heads page's clicked patch is this page's too; the centre patch until one is clicked.
    patch = st.session_state.get(keys.PATCH)
    if patch is None:
        patch = layout.centre_patch
    patch_picker(r.model_input, layout, "anatomy_click", shown=patch)
    st.caption(f"Click a patch to make it the query (choose \"clicked patch\"). Patch: "
               f"{layout.token_name(layout.num_prefix_tokens + patch)}.")

query = layout.cls_index if query_label == "CLS" else layout.num_prefix_tokens + patch
query_patch = None if query_label == "CLS" else patch
try:
    qkv = cached_layer_qkv(ctx.spec, ctx.image.sha256, ctx.image.image, layer)
except VitvizError as exc:  # a model family whose q, k and v are not read here
    st.error(str(exc))
    st.stop()
a = attention_anatomy(qkv, head, query)
d, N = qkv.head_dim, len(a.scores)
name = layout.token_name(query)
where = f"layer {layer + 1}, head {head + 1}, query {name}"
stem = file_stem("anatomy", ctx.image.name, f"layer{layer + 1}", f"head{head + 1}",
                 "cls" if query_label == "CLS" else f"patch{patch}")  # the patch number the page shows

first.subheader("1 · The query, the keys, the values")
first.caption("Each token's vector is projected three ways: a query (what it looks for), a key (what it offers) and a "
           f"value (what it passes on). Each head works in its own d = {d} dimensions. "
           + (" ".join(s[0].upper() + s[1:] + "." for s in qkv.steps) if qkv.steps else ""))
with first:
    show_chart(vector_figure(a.q, f"q of {name}, ‖q‖ = {a.q_norm:.2f}", "component"),
               "anatomy_q", file_stem(stem, "q"))

st.subheader("2 · Scores: the dot product q·k with every key")
st.caption("The dot product measures how well the query matches each key: large and positive for a good match, "
           "near zero or negative for none. One score per token.")
map_col, bar_col = st.columns([1, 1.3])
with map_col:
    show_chart(score_map_figure(r.model_input, a.scores, layout, query=query_patch,
                                title=f"q·k<sub>j</sub> over the patches, {where}"),
               "anatomy_scores", file_stem(stem, "scores"))
    prefix = ", ".join(f"{t}: {a.scores[i]:.2f}" for i, t in enumerate(layout.prefix_tokens))
    st.caption(f"Colours span this row's lowest to highest score over the patches (the softmax ignores a constant "
               f"added to every score: only differences count). Prefix tokens, not on the map: {prefix or 'none'}.")
with bar_col:
    show_chart(sorted_scores_figure(a, layout), "anatomy_sorted", file_stem(stem, "sorted_scores"))

st.subheader(f"3 · Scaling by 1/√d = 1/√{d} = {a.scale:.4g}")
(lo, hi, spread), (lo_scaled, hi_scaled, spread_scaled) = span(a.scores), span(a.scores_times_scale)
st.markdown(f"The scores span **{lo:.2f} … {hi:.2f}** (a range of {spread:.2f}); "
            f"multiplied by {a.scale:.4g} they span **{lo_scaled:.2f} … {hi_scaled:.2f}** "
            f"(a range of {spread_scaled:.2f}). Dot products of d-dimensional vectors grow with √d; the scaling "
            "keeps the softmax out of the region where one token takes everything and gradients vanish. "
            "It acts like a temperature √d on the softmax."
            + (f" Then this head's learned relative position bias bⱼ (one value per pair of positions) is added: "
               f"for this query it spans **{a.bias.min():.2f} … {a.bias.max():.2f}**, giving logits "
               f"**{a.scaled.min():.2f} … {a.scaled.max():.2f}**." if qkv.bias is not None else ""))

st.subheader("4 · Softmax: scores become weights that sum to 1")
top_unscaled, top_scaled = a.unscaled_weights.max(), a.weights.max()
st.caption(f"softmax(x)ⱼ = exp(xⱼ) / Σ exp(x). Without the scaling the largest weight would be {top_unscaled:.1%} "
           f"and the row's entropy {a.entropy(a.unscaled_weights):.2f} nats (≈ {a.tokens_worth(a.unscaled_weights):.1f} "
           f"tokens' worth); with it, {top_scaled:.1%} and {a.entropy(a.weights):.2f} nats "
           f"(≈ {a.tokens_worth(a.weights):.1f} tokens; uniform over {N} tokens = ln {N} = "
           f"{a.uniform_entropy:.2f}).")
show_chart(softmax_figure(a, layout), "anatomy_softmax", file_stem(stem, "softmax"))

st.subheader("5 · The attention row")
row_map = a.patch_row(layout)
sinks = r.sinks.patch_sinks(layout, [layer]) if display.exclude_sinks else None
title = f"Attention of {name}, layer {layer + 1}, head {head + 1}"
rendered, fig = map_figure(r.model_input, row_map, layout, display, titles=[""], title=title,
                           query=query_patch, sinks=sinks, tile_px=420)
row_col, prefix_col = st.columns([1.3, 1])
with row_col:
    show_chart(fig, "anatomy_row", file_stem(stem, "row"), vector=False)
    st.caption(rendered.caption() + " This is the map the heads page shows for the same layer, head and query.")
with prefix_col:
    st.markdown("Weights on the prefix tokens (not on the map):")
    st.table({t: f"{a.weights[i]:.2%}" for i, t in enumerate(layout.prefix_tokens)} or {"none": "—"})
    on_patches, _ = a.held_by(layout.patch_slice)
    st.markdown(f"Patches together: **{on_patches:.2%}**. The weights sum to {a.held_by(slice(None))[0]:.6f}.")

st.subheader("6 · The output: a weighted sum of the value vectors")
norm_out = a.output_norm
st.caption(f"output = Σⱼ wⱼ vⱼ over all {N} tokens: each token passes on its value vector, scaled by its weight. "
           f"‖output‖ = {norm_out:.3f} (this head's {d} dimensions of the block's output before the projection back "
           f"to the embedding). Share of output: the projection of wⱼvⱼ on the output, as a share of ‖output‖²; "
           "the shares of all tokens sum to 100%.")
order = a.top_contributors(TOP)
contrib_norms, value_norms, share = a.contribution_norms, a.value_norms, a.output_shares
table_col, chart_col = st.columns([1, 1.3])
with table_col:
    st.dataframe({"token": [layout.token_name(int(j)) for j in order],
                  "weight wⱼ": [f"{a.weights[j]:.4f}" for j in order],
                  "‖vⱼ‖": [f"{value_norms[j]:.3f}" for j in order],
                  "‖wⱼ vⱼ‖": [f"{contrib_norms[j]:.3f}" for j in order],
                  "share of output": [f"{share[j]:.1%}" for j in order]},
                 hide_index=True, key="anatomy_table")
    top_weight, top_output = a.held_by(order)
    st.caption(f"The top {TOP} tokens hold {top_weight:.1%} of the weight and {top_output:.1%} of the output.")
with chart_col:
    show_chart(contributions_figure(a, layout), "anatomy_contributions", file_stem(stem, "contributions"))

download_row(stem, {"q": a.q, "keys": qkv.k[head], "values": a.values, "scores": a.scores,
                    "scaled_scores": a.scaled, "relative_position_bias": a.bias, "softmax_unscaled": a.unscaled_weights,
                    "attention_row": a.weights,
                    "contributions": a.contributions, "output": a.output},
             display.settings(rendered) | {
                 "image": ctx.image.name, "sha256": ctx.image.sha256, "model": ctx.loaded.card()["spec"],
                 "layer (1-based)": layer + 1, "head (1-based)": head + 1,
                 "query token (0-based sequence index)": int(query), "query": name, "scale": a.scale, "d_head": d,
                 "steps": qkv.steps, "token_indices": "0-based sequence indices, prefix tokens first"},
             panel_download(r.model_input, row_map, display, [""], title, query=query_patch, sinks=sinks, columns=1))
