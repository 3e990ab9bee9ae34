"""How much memory a setting will take, decided before anything runs.

One image's attention is an (L, H, N, N) float32 tensor: at 1036 px the bundled model's is
8.6 GiB. The input resolution is refused when that tensor would not fit the operator's limit
(:attr:`vitviz.settings.Settings.attention_limit_bytes`), with the largest size that fits.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from .declared import check_weights
from ..errors import ModelError
from ..settings import megabytes
from .names import parse_model_name
from ..types import Architecture, WindowArchitecture

__all__ = ["Architecture", "WindowArchitecture", "admit", "admit_fitted", "architecture", "check_resolution"]


def architecture(name: str) -> Architecture | None:
    """The architecture of ``"bundled"``, a timm model name or a ``torchvision:`` builder (built on the meta device:
    no memory) or a transformers folder / ``hf:`` hub id (read from its config on disk, never downloaded).

    None when it cannot be known before loading (the loader then says why).
    """
    # Not cached: a folder's config can change between two loads.
    kind = parse_model_name(name).kind
    if kind == "torchvision":
        return _torchvision_architecture(name)
    return _hf_architecture(name) if kind == "transformers" else _timm_architecture(name)


@functools.lru_cache(maxsize=64)
def _torchvision_architecture(name: str) -> Architecture | None:
    from ..adapters import find_adapter
    from ..errors import ModelError
    from .torchvision_models import meta_architecture

    try:
        model = meta_architecture(name)
    except ModelError:
        return None  # the loader says why
    adapter = find_adapter(model)
    return None if adapter is None or adapter.why_unsupported(model) else adapter.architecture(model)


@functools.lru_cache(maxsize=64)
def _timm_architecture(name: str) -> Architecture | None:
    import timm

    from . import bundled

    bundled_model = parse_model_name(name).kind == "bundled"
    arch = bundled.TIMM_ARCH if bundled_model else name
    if not timm.is_model(arch):
        return None
    try:
        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False)
    except Exception:  # noqa: BLE001 - an architecture timm cannot build is reported by the loader
        return None
    from ..adapters import find_adapter

    adapter = find_adapter(model)
    if adapter is None or adapter.why_unsupported(model):
        return None
    found = adapter.architecture(model)
    return replace(found, default_size=bundled.ONNX_INPUT_SIZE) if bundled_model else found


def _hf_architecture(name: str) -> Architecture | None:
    """A transformers model's architecture from its config on disk; None when it cannot be read offline."""
    from . import hf
    from ..adapters.hf_common import config_layout

    config = hf.cached_config(name)
    if config is None:
        return None
    from ..adapters.registry import hf_config_architecture

    found = hf_config_architecture(config)  # a family whose adapter reads its own config (Swin's stages)
    if found is not None:
        return found
    vision = hf.vision_config(config)
    layout = config_layout(config)
    if layout is None:  # a model type vitviz does not read: the loader says so
        return None
    return Architecture(depth=int(vision.num_hidden_layers), heads=int(vision.num_attention_heads),
                        patch=layout.patch_size, prefix_tokens=layout.num_prefix_tokens,
                        default_size=layout.grid_size[0] * layout.patch_size[0])


def check_resolution(name: str, img_size: int | None, limit_bytes: int, max_img_size: int | None = None,
                     batch: int = 1) -> None:
    """Refuse an input resolution whose attention for one batch would exceed ``limit_bytes``.

    Args:
        name: ``"bundled"``, a timm model name, or a transformers folder / ``hf:`` hub id.
        img_size: the requested input resolution; None for the model's own.
        limit_bytes: the largest attention tensor of one batch allowed.
        max_img_size: an operator's cap on the resolution (shared mode), or None.
        batch: images per forward (the app runs one; ``analyze`` up to ``--batch-size``).

    Raises:
        ModelError: a sentence with the size the setting needs and the largest size that fits.
    """
    arch = architecture(name)
    if arch is None:
        return
    label = "the bundled model" if parse_model_name(name).kind == "bundled" else name
    _check(arch, label, img_size or arch.default_size, limit_bytes, max_img_size, batch)


def _check(arch: Architecture, label: str, size: int, limit_bytes: int, max_img_size: int | None, batch: int) -> None:
    """:func:`check_resolution` for a known architecture; ``label`` names the model in the sentence."""
    if max_img_size is not None and size > max_img_size:
        raise ModelError(f"Input resolution {size} px is over this server's cap of {max_img_size} px "
                         "(VITVIZ_MAX_IMG_SIZE); choose a smaller size.")
    needed = batch * arch.attention_bytes(size)
    if needed <= limit_bytes:
        return
    largest = arch.largest_size(limit_bytes // batch)
    way_out = (f"the largest size that fits is {largest} px" if largest
               else "no input size fits; ask the operator for a larger VITVIZ_CACHE_MB")
    if batch == 1:
        what, count, unit = "one image", "", "per image"
    else:
        what, count, unit = f"a batch of {batch} images", f"{batch} images x ", "per batch"
        way_out += f" (or a smaller --batch-size: one image needs {megabytes(arch.attention_bytes(size))})"
    raise ModelError(f"Input resolution {size} px: {label}'s attention for {what} would take {megabytes(needed)} "
                     f"({count}{arch.composition(size)}), over this server's "
                     f"limit of {megabytes(limit_bytes)} {unit} (half of VITVIZ_CACHE_MB); {way_out}.")


def admit(spec, settings, batch: int = 1) -> None:
    """Refuse a :class:`vitviz.sources.models.ModelSpec` the operator's settings do not allow, before anything is built.

    Checks the model allow-list, devices, precisions, the size the model's files declare against the
    cache budget (:func:`vitviz.sources.declared.check_weights`), the resolution cap and the attention budget
    of ``batch`` images per forward. The bundled model is always allowed (it is offline and small).

    Raises:
        ModelError: a sentence naming the setting and the way out.
    """
    if spec.name != "bundled" and not settings.allows_model(spec.name):
        raise ModelError(f"Model {spec.name!r} is not on this server's allow-list (VITVIZ_MODELS: "
                         f"{', '.join(settings.models)}); nothing was loaded.")
    if settings.devices is not None and spec.device not in settings.devices:
        raise ModelError(f"Device {spec.device!r} is not allowed on this server (VITVIZ_DEVICES: "
                         f"{', '.join(settings.devices)}).")
    if settings.dtypes is not None and spec.dtype not in settings.dtypes:
        raise ModelError(f"Precision {spec.dtype!r} is not allowed on this server (VITVIZ_DTYPES: "
                         f"{', '.join(settings.dtypes)}).")
    check_weights(spec.name, settings.cache_bytes, spec.img_size)
    check_resolution(spec.name, spec.img_size, settings.attention_limit_bytes, settings.max_img_size, batch)


def admit_fitted(loaded, settings, batch: int = 1) -> None:
    """:func:`admit`'s attention budget for the architecture a checkpoint was fitted to, before the model runs.

    :func:`admit` knows only the name's architecture; a checkpoint fine-tuned at 384 px (or with register
    tokens) builds a larger one (:func:`vitviz.sources.checkpoints.fit_architecture`), known once it is read.

    Args:
        loaded: a :class:`vitviz.sources.models.LoadedModel`.
        settings: the operator's :class:`vitviz.settings.Settings`.
        batch: images per forward.

    Raises:
        ModelError: the fitted architecture's attention would not fit (the sentence of :func:`check_resolution`).
    """
    if loaded.spec.checkpoint is None:
        return
    arch = loaded.adapter.architecture(loaded.model)
    _check(arch, loaded.label, int(loaded.data_config["input_size"][-1]), settings.attention_limit_bytes,
           settings.max_img_size, batch)
