"""Cached runs of the registers page: the outlier search over the image set and one image before and after a
repair (vitviz.analyses.registers does the maths; this keeps each result in the shared byte store)."""
from __future__ import annotations

import numpy as np

from vitviz.sources.preprocess import preprocess
from vitviz.sources.models import ModelSpec
from vitviz.analyses.registers import (RepairMaps, Search, TestTimeRegister, mask_keys, neuron_maps, repair_maps, sink_mask,
                              why_no_register)
from vitviz.analyses.per_image import ImageAnalyses
from vitviz.runs.registers_run import search_images

from .cache import _model_run, cached_model, store
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
