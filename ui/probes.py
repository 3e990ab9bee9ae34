"""The Probes page's sections: the images sorted into groups (:func:`sort_section`), the probes of every layer trained
on a press (:func:`train_section`), the layer the head reads (:func:`layer_choice`), the accuracy per layer
(:func:`accuracy_section`) and the best layer's probe as the model's head (:func:`head_section`)."""
from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import streamlit as st

import vitviz.probes
from ui.cache import cached_lens
from ui.charts import file_stem, show_chart
from ui.keys import PROBE_HEAD
from ui.navigation import concepts_link
from ui.words import counted, subject
from vitviz.errors import VitvizError
from vitviz.probes import LabelledImages, ProbeResult
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


def intro() -> None:
    """What a probe per layer says and how its accuracy is measured."""
    st.caption("A linear probe (logistic regression, L2, C chosen by stratified cross-validation on the training "
               "images only) on each layer's pooled vector says from which layer on your groups are linearly "
               "decodable (Alain & Bengio 2016; DINOv2's linear evaluation). Accuracy is out-of-fold: every image is "
               "predicted by a probe that never saw it; the bars are 95% Wilson intervals over the images, the dashed "
               f"line is chance (the largest group's share) {concepts_link('chance')}. The best layer's probe becomes "
               "a head the other pages can use. To probe a concept painted on patches instead of whole images, see "
               "the Painted concepts page.")


def probe_backbone(ctx):
    """The sidebar's model without a probe head (probes are trained on the backbone), or None, said on the page,
    when its layers do not all hold the same tokens (Swin)."""
    backbone = cached_lens(replace(ctx.spec, head=None))
    if backbone.scope != "global":
        st.info(f"{backbone.label} attends within windows and pools only its last stage: probes read models whose "
                "every layer has the same tokens.")
        return None
    return backbone


@dataclass
class ProbeChoice:
    """The groups the user typed, the pooling, and the images sorted into them (by name: ``(image, group)``)."""
    groups: list[str]
    pooling: str
    chosen: dict
    buttons: object  # the column the Train button and its rule sit in

    @property
    def images(self) -> LabelledImages:
        return LabelledImages(tuple(im for im, _ in self.chosen.values()), tuple(self.chosen),
                              tuple(g for _, g in self.chosen.values()),
                              tuple(f"{n} (its group box)" for n in self.chosen))


def sort_section(ctx) -> ProbeChoice:
    """The groups, the pooling and a group box under each of the sidebar's images (alternating by default, so two
    groups are ready to try)."""
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
                                 index=1 + i % len(groups) if groups else 0)
            if group != UNUSED:
                chosen[image.name] = (image, group)
    return ProbeChoice(groups, pooling, chosen, left)


def _result_key(backbone, choice: ProbeChoice) -> tuple:
    return ("probe_result", backbone.spec, choice.pooling,
            tuple(sorted((n, im.sha256, g) for n, (im, g) in choice.chosen.items())))


def train_section(backbone, choice: ProbeChoice) -> ProbeResult | None:
    """The Train button, disabled with the rule the groups do not meet yet; on a press the model runs once per image
    and every layer's probe is fitted. The result is kept for these images, groups and pooling; None until then
    (the instructions shown, or the error that replaced them)."""
    images = choice.images
    try:  # the rule is said before a press: the button waits until the groups meet it
        images.check("the group boxes")
        not_ready = None
    except VitvizError as exc:
        not_ready = str(exc)
    run = choice.buttons.button("Train a probe on every layer", type="primary", disabled=not_ready is not None,
                                help=not_ready and f"Not yet: {not_ready}")
    if not_ready:
        choice.buttons.caption(f"Not yet: {not_ready}")
    key = _result_key(backbone, choice)
    n = len(choice.chosen)
    failed = False
    if run:
        bar = st.progress(0.0, text="Features of every layer ...")
        try:
            result = vitviz.probes.fit(backbone, images, pooling=choice.pooling, progress=lambda done: bar.progress(
                done / n, text=f"Features: {done} of {counted(n, 'image')} (one forward each)"))
            bar.progress(1.0, text="Cross-validating every layer's probe ...")
            st.session_state[key] = result
        except VitvizError as exc:
            st.error(str(exc))
            failed = True
        bar.empty()
    result = st.session_state.get(key)
    if result is None and not failed:  # beside an error the instructions would contradict it
        st.info("Sort at least two images into each of two groups and press the button: the model runs once per "
                "image and the probes of all layers are fitted on those features.")
    return result


def layer_choice(result: ProbeResult) -> ProbeResult:
    """The result with the head at the layer the slider picks (default: the most accurate, the earliest of equals)."""
    layer = st.select_slider("The head's layer", [s.layer for s in result.layers], value=result.layer,
                             key="probe_layer", help="Default the most accurate layer (the earliest of equals).")
    return result if layer == result.layer else result.at_layer(layer)


def accuracy_title(images: int, groups: int, pooling: str) -> str:
    """The accuracy figure's title: "Linear-probe accuracy per layer · 4 images, 2 groups · cls pooling"."""
    return (f"Linear-probe accuracy per layer · {counted(images, 'image')}, {counted(groups, 'group')} · "
            f"{pooling} pooling")


def accuracy_caption(label: str, chance: float, pooling: str, images: int) -> str:
    """Under the accuracy figure: the model, chance, the pooling, and the step one image makes in the accuracy."""
    return (f"{label}. Chance {chance:.0%} (the largest group). Pooling: {POOLINGS[pooling]}. With few images the "
            f"intervals are wide: {subject(images, 'image', ('gives', 'give'))} a step of {1 / images:.0%} per image.")


def accuracy_section(backbone, pooling: str, result: ProbeResult) -> None:
    """Accuracy per layer with its intervals and chance, the head's C search in a sentence, the table."""
    show_chart(accuracy_figure(result.table, result.chance, result.layer,
                               accuracy_title(len(result.images), len(result.classes), pooling)),
               "probe_accuracy", file_stem("probes", backbone.spec.name, pooling))
    st.caption(accuracy_caption(backbone.label, result.chance, pooling, len(result.images)))
    head_note = result.C_search.note() if result.C_search else None
    if head_note:
        st.caption(f"The head's {head_note}")
    st.dataframe(probe_table(result.table), hide_index=True, height="content")


def head_section(ctx, result: ProbeResult) -> None:
    """The probe's files, and a button that makes the chosen layer's probe the model's head on every page."""
    files = result.files()
    c1, c2, c3 = st.columns(3)
    c1.download_button("probe.safetensors", files["probe.safetensors"], file_name="probe.safetensors",
                       help="weight (K, D), bias (K,): logits = pooled @ weight.T + bias; the description in its "
                            "metadata")
    c2.download_button("probe.json", files["probe.json"], file_name="probe.json", mime="application/json")
    if c3.button(f"Use the layer-{result.layer} probe as the model's head", help="Every page then shows the groups "
                 "as classes: top-k, gradient rollout, class targets for attribution, Chefer's protocols."):
        digest = hashlib.sha256(files["probe.safetensors"]).hexdigest()[:32]
        path = Path(tempfile.gettempdir()) / f"vitviz-head-{digest}" / "probe.safetensors"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_bytes(files["probe.safetensors"])
        st.session_state[PROBE_HEAD] = str(path)
        st.session_state["use_trained_head"] = True
        st.rerun()
    if ctx.spec.head:
        st.caption(f"The model's head now: {Path(ctx.spec.head).name} ({ctx.lens.label}).")

