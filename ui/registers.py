"""The registers page's runs and its before/after section: the outlier search over the image set and one image
before and after a repair, each kept in the shared byte store (vitviz.analyses.registers does the maths), and
:func:`before_after`, which draws one repair's maps side by side."""
from __future__ import annotations

import numpy as np
import streamlit as st

from vitviz.sources.preprocess import preprocess
from vitviz.sources.models import ModelSpec
from vitviz.analyses.registers import (RepairMaps, Search, TestTimeRegister, mask_keys, neuron_maps, repair_maps, sink_mask,
                              why_no_register)
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.analyses.rollout import readout_label
from vitviz.runs.registers_run import search_images

from vitviz.figures.registers_figures import maps_figure, output_change_table

from .cache import _model_run, cached_model, store
from .charts import file_stem, show_chart
from .downloads import download_row
from .guard import guarded
from .repair import NORMS_AXES, show_table
from .words import counted


def cached_search(spec: ModelSpec, shas: tuple[str, ...], _images: list, factor: float) -> Search:
    """Norms, outliers and register neurons of the image set (one forward per 8 images)."""
    return store().get_or_compute(("registers_search", spec, shas, factor), _model_run(
        f"Searching {counted(len(_images), 'image')} for outliers and register neurons ...",
        lambda: search_images(cached_model(spec), _images, factor=factor)))


def _input(spec: ModelSpec, image):
    loaded = cached_model(spec)
    param = next(loaded.model.parameters())
    return loaded, preprocess([image], loaded.data_config).tensor.to(param.device, param.dtype)


def cached_sink_masking(spec: ModelSpec, sha256: str, _image, _result: ImageAnalyses) -> RepairMaps:
    """The current image with its patch sinks (per layer) dropped as keys, rows renormalised.

    ``_image``: the image as loaded (the model's own preprocessing runs again, as for ``_result``)."""
    def compute():
        loaded, x = _input(spec, _image)
        edit = mask_keys(sink_mask([_result.sinks], _result.layout, x.device))
        return repair_maps(loaded.model, x, _result.layout, edit)

    return store().get_or_compute(("registers_sinks", spec, sha256), _model_run("Masking the sinks ...", compute))


def cached_register(spec: ModelSpec, sha256: str, _image, neurons: tuple[tuple[int, int], ...],
                    init: str) -> RepairMaps | str:
    """The current image with the test-time register of ``neurons``, or the sentence why the model cannot take it."""
    def compute():
        loaded, x = _input(spec, _image)
        why = why_no_register(loaded.model)
        if why:
            return why
        register = TestTimeRegister(neurons, init)
        return repair_maps(loaded.model, x, loaded.layout, register.edit(loaded.layout), register.layout(loaded.layout))

    return store().get_or_compute(("registers_repair", spec, sha256, neurons, init),
                                  _model_run("Running with the test-time register ...", compute))


def cached_neuron_maps(spec: ModelSpec, sha256: str, _image, _neurons: list, key: tuple) -> np.ndarray:
    """Each listed neuron's activation over the current image's patches (k, gh, gw)."""
    def compute():
        loaded, x = _input(spec, _image)
        return neuron_maps(loaded.model, x, loaded.layout, _neurons)

    return store().get_or_compute(("registers_neurons", spec, sha256, key), _model_run("Reading the neurons ...", compute))


@guarded("the maps before and after the repair")
def before_after(ctx, name: str, maps: RepairMaps, key: str, marked, marked_what: str, padding) -> None:
    """Last-layer heads and rollout before and after one repair, on shared scales, and the output change;
    ``marked``: the patches the repair acts on (crossed; they set no colour limit), ``marked_what`` what they are;
    ``padding``: the padding patches, hatched as the Display box says."""
    r, layout = ctx.result, ctx.result.layout
    H = len(maps.heads_before)
    head = st.selectbox("Head (last layer)", ["mean over heads"] + [f"head {h + 1}" for h in range(H)], key=f"{key}_head")
    tiles = maps.last_layer(None if head == "mean over heads" else int(head.split()[1]) - 1)
    readout = readout_label(maps.layout_before)
    cols = st.columns(2)
    with cols[0]:
        fig, caption = maps_figure(r.model_input, tiles, ["before", f"after ({name})"], layout,
                                   f"Last layer, {head}, {readout} → patches", value_name="attention", columns=2,
                                   tile_px=260, marked=marked, marked_what=marked_what, padding=padding)
        show_chart(fig, f"{key}_heads", file_stem(key, "heads", ctx.image.name))
        st.caption(caption + " One colour scale for both.")
    with cols[1]:
        fig, caption = maps_figure(r.model_input, np.stack([maps.rollout_before, maps.rollout_after]),
                                   ["before", f"after ({name})"], layout, f"Rollout of the {readout}, all layers",
                                   value_name="rollout", columns=2, tile_px=260, marked=marked,
                                   marked_what=marked_what, padding=padding)
        show_chart(fig, f"{key}_rollout", file_stem(key, "rollout", ctx.image.name))
        st.caption(caption + " One colour scale for both.")
    extra = maps.extra_token_norm()
    st.caption("Crossed: the patches the repair acts on. Largest patch norm / median in the last layer: "
               f"before {maps.norm_ratio(after=False):.2f}, after {maps.norm_ratio(after=True):.2f}"
               + (f"; the extra token's norm there: {extra[0]:.3g} (the median patch's {extra[1]:.3g})."
                  if extra else "."))
    st.markdown("**Output change** (this image)")
    show_table(output_change_table(maps.change, [ctx.image.name]))
    download_row(file_stem(key, ctx.image.name), {
        "heads_before": maps.heads_before, "heads_after": maps.heads_after, "rollout_before": maps.rollout_before,
        "rollout_after": maps.rollout_after, "norms_before": maps.norms_before, "norms_after": maps.norms_after},
        {"image": ctx.image.name, "repair": name, "model": ctx.loaded.card()["spec"],
         "token_layout_after": maps.layout_after.to_dict(), "axes": NORMS_AXES + "; heads_*[head - 1]: the last layer",
         "output_change": maps.change.to_dict()})
