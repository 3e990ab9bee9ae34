"""Probes: what each layer knows — a linear probe per layer on the session's images sorted into named groups."""
import hashlib
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from ui.cache import cached_lens
from ui.charts import file_stem, show_chart
from ui.keys import PROBE_HEAD
from ui.state import setup
from ui.navigation import concepts_link, heading
from vitviz.errors import VitvizError
from vitviz.probes import LabelledImages, fit
from vitviz.probes.features import POOLINGS
from vitviz.probes.figures import accuracy_figure

UNUSED = "(not used)"
# The table's columns in words (probe.json keeps the code names: layer, accuracy, low, high, folds, C, C_at_edge).
TABLE_COLUMNS = {"layer": "layer", "accuracy": "accuracy (out of fold)", "low": "95 % interval from",
                 "high": "95 % interval to", "folds": "cross-validation folds", "C": "regularisation C (inverse)",
                 "C_at_edge": "folds whose C hit the grid's end"}


def probe_table(rows: list[dict]) -> pd.DataFrame:
    """The per-layer probe table with words for headers and 3 decimals for the accuracies."""
    table = pd.DataFrame(rows).round({"accuracy": 3, "low": 3, "high": 3})
    return table.rename(columns=TABLE_COLUMNS)


ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
st.caption("A linear probe (logistic regression, L2, C chosen by stratified cross-validation on the training images "
           "only) on each layer's pooled vector says from which layer on your groups are linearly decodable (Alain & "
           "Bengio 2016; DINOv2's linear evaluation). Accuracy is out-of-fold: every image is predicted by a probe that "
           "never saw it; the bars are 95% Wilson intervals over the images, the dashed line is chance (the largest "
           f"group's share) {concepts_link('chance')}. The best layer's probe becomes a head the other pages can "
           "use. To probe a concept painted on patches instead of whole images, see the Painted concepts page.")
backbone_spec = replace(ctx.spec, head=None)
backbone = cached_lens(backbone_spec)  # probes are trained on the backbone, never on a probe head
if backbone.scope != "global":
    st.info(f"{backbone.label} attends within windows and pools only its last stage: probes read models whose every "
            "layer has the same tokens.")
    st.stop()

left, right = st.columns([1, 2])
groups = [g.strip() for g in left.text_area("Groups, one per line", "group 1\ngroup 2", height=110,
                                            key="probe_groups").splitlines() if g.strip()]
groups = list(dict.fromkeys(groups))
pooling = left.radio("Pooling", list(POOLINGS), key="probe_pooling", help="\n\n".join(
    f"**{k}**: {v}" for k, v in POOLINGS.items()))
right.markdown("**Sort the images into groups** (upload more in the sidebar; every group needs two or more)")
columns = right.columns(4)
chosen = {}
for i, image in enumerate(ctx.images):
    with columns[i % 4]:
        st.image(image.image, width=120)
        group = st.selectbox(image.name, [UNUSED, *groups], key=f"probe_group_{image.sha256}",
                             index=1 + i % len(groups) if groups else 0)  # alternating: two groups ready to try
        if group != UNUSED:
            chosen[image.name] = (image, group)

images = LabelledImages(tuple(im for im, _ in chosen.values()), tuple(chosen), tuple(g for _, g in chosen.values()),
                        tuple(f"{n} (its group box)" for n in chosen))
try:  # the rule is said before a press: the button waits until the groups meet it
    images.check("the group boxes")
    not_ready = None
except VitvizError as exc:
    not_ready = str(exc)
run = left.button("Train a probe on every layer", type="primary", disabled=not_ready is not None,
                  help=not_ready and f"Not yet: {not_ready}")
if not_ready:
    left.caption(f"Not yet: {not_ready}")
key = ("probe_result", backbone_spec, pooling, tuple(sorted((n, im.sha256, g) for n, (im, g) in chosen.items())))
failed = False
if run:
    try:
        bar = st.progress(0.0, text="Features of every layer ...")
        result = fit(backbone, images, pooling=pooling,
                     progress=lambda done: bar.progress(done / len(chosen), text=f"Features: {done} of {len(chosen)} "
                                                                                  "images (one forward each)"))
        bar.progress(1.0, text="Cross-validating every layer's probe ...")
        st.session_state[key] = result
        bar.empty()
    except VitvizError as exc:
        bar.empty()
        st.error(str(exc))
        failed = True
result = st.session_state.get(key)
if result is None:
    if not failed:  # beside an error the instructions would contradict it
        st.info("Sort at least two images into each of two groups and press the button: the model runs once per "
                "image and the probes of all layers are fitted on those features.")
    st.stop()

layer = st.select_slider("The head's layer", [s.layer for s in result.layers], value=result.layer, key="probe_layer",
                         help="Default the most accurate layer (the earliest of equals).")
if layer != result.layer:
    result = result.at_layer(layer)
stem = file_stem("probes", backbone.spec.name, pooling)
show_chart(accuracy_figure(result.table, result.chance, result.layer,
                           f"Linear-probe accuracy per layer · {len(result.images)} images, {len(result.classes)} "
                           f"groups · {pooling} pooling"), "probe_accuracy", stem)
st.caption(f"{backbone.label}. Chance {result.chance:.0%} (the largest group). Pooling: {POOLINGS[pooling]}. "
           f"With few images the intervals are wide: {len(result.images)} images give a step of "
           f"{1 / len(result.images):.0%} per image.")
head_note = result.C_search.note() if result.C_search else None
if head_note:
    st.caption(f"The head's {head_note}")
st.dataframe(probe_table(result.table), hide_index=True, height="content")
files = result.files()
c1, c2, c3 = st.columns(3)
c1.download_button("probe.safetensors", files["probe.safetensors"], file_name="probe.safetensors",
                   help="weight (K, D), bias (K,): logits = pooled @ weight.T + bias; the description in its metadata")
c2.download_button("probe.json", files["probe.json"], file_name="probe.json", mime="application/json")
if c3.button(f"Use the layer-{result.layer} probe as the model's head", help="Every page then shows the groups as "
             "classes: top-k, gradient rollout, class targets for attribution, Chefer's protocols."):
    digest = hashlib.sha256(files["probe.safetensors"]).hexdigest()[:32]
    path = Path(tempfile.gettempdir()) / f"vitviz-head-{digest}" / "probe.safetensors"
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(files["probe.safetensors"])
    st.session_state[PROBE_HEAD] = str(path)
    st.session_state["use_trained_head"] = True
    st.rerun()
if ctx.spec.head:
    st.caption(f"The model's head now: {Path(ctx.spec.head).name} ({ctx.lens.label}).")
