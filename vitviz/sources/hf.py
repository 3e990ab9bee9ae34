"""Hugging Face ``transformers`` vision models: load them, read their configs and run their image processors.

What a family is and how its forward runs lives in its adapter (``vitviz/adapters/hf_*.py``); the
adapters list the ``model_type`` values they read (``Adapter.hf_model_types``) and :func:`load` builds exactly
those. transformers computes attention with SDPA by default and then returns *no* probabilities for
``output_attentions=True`` (an empty tuple, no error): the loader therefore builds every model with
``attn_implementation="eager"`` once, so the library's own forward (the adapters' parity reference)
is the eager one; nothing is switched per request, so one model is shared by every session and thread.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..errors import ModelError, first_line
from .names import HF_PREFIX, parse_model_name

PREFIX = HF_PREFIX
LIBRARY = "transformers"


def is_hf_name(name: str) -> bool:
    """Whether a model box entry names a transformers model: ``hf:<hub id>`` or a folder path."""
    return parse_model_name(name).kind == "transformers"


def vision_config(config):
    """The vision part of a config (a full CLIP/SigLIP config holds it as ``vision_config``)."""
    return getattr(config, "vision_config", None) or config


def cached_config(name: str):
    """The config of a model box entry read from disk only (a folder or the local hub cache), or None.

    Nothing is downloaded or built: the memory budget reads the depth, heads and grid from it
    before the loader runs.
    """
    from transformers import AutoConfig

    try:
        source, hub = _resolve(name)
        return AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception:  # noqa: BLE001 - the loader says why a folder or id cannot be read
        return None


# ---------------------------------------------------------------------------------------------
# Loading


def _resolve(name: str) -> tuple[str, bool]:
    """(what ``from_pretrained`` takes, whether it is a hub id) for a model box entry.

    Raises:
        ModelError: a folder that does not exist or lacks config.json; an uncached hub id offline.
    """
    if name.startswith(PREFIX):
        repo_id = name[len(PREFIX):].strip()
        if not repo_id:
            raise ModelError("Hugging Face model 'hf:' names no hub id (e.g. hf:google/vit-base-patch16-224).")
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        from .hub import _hub_reachable

        try:  # the cache lookup below raises on a malformed id
            validate_repo_id(repo_id)
        except HFValidationError as exc:
            raise ModelError(f"Model {name!r}: {repo_id!r} is not a Hugging Face hub id ({first_line(exc)}); a hub id "
                             "is owner/name, e.g. hf:google/vit-base-patch16-224.") from exc
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
        if not cached and not _hub_reachable():
            raise ModelError(f"Model {name!r} could not be loaded: it is not in the local Hugging Face cache and the "
                             "hub cannot be reached (no internet, or offline mode). Use the bundled model, or a "
                             "local folder saved with save_pretrained.")
        return repo_id, True
    folder = Path(name).expanduser()
    if not folder.is_dir():
        raise ModelError(f"Model folder {folder}: no such folder (for a hub id write hf:owner/name).")
    if not (folder / "config.json").is_file():
        raise ModelError(f"Model folder {folder}: it has no config.json, so it is not a folder saved with "
                         "transformers' save_pretrained.")
    return str(folder), False


def _model_type(config, name: str, types: dict):
    """The :class:`vitviz.types.HFModelType` of a config among ``types`` (model_type -> HFModelType, the types
    the adapters read: ``vitviz.adapters.hf_model_types()``)."""
    model_type = getattr(config, "model_type", "")
    if model_type not in types:
        labels = ", ".join(sorted({t.label for t in types.values()})) or "no"
        raise ModelError(f"Model {name!r} is not supported yet: its config is a {model_type or 'unknown'!r} "
                         f"({', '.join(config.architectures or []) or type(config).__name__}) model. vitviz reads "
                         f"attention from transformers {labels} models.")
    return types[model_type]


def load(name: str, device: torch.device, dtype: torch.dtype, more: dict | None = None):
    """Build a transformers vision model with eager attention, in eval mode, on ``device``.

    A whole image–text model (a ``CLIPModel`` folder, :func:`vitviz.sources.text.is_full_model`) is built whole, once:
    the vision tower is its ``vision_model`` and the rest is its :class:`~vitviz.sources.text.TextTower`.

    ``more``: model_type -> :class:`vitviz.types.HFModelType`, the types that may be built (the adapters'
    ``vitviz.adapters.hf_model_types()``); a config of another type is refused with a sentence.

    Returns:
        (model, family, source, text): ``family`` is the type's HFModelType, ``source`` the folder or hub id the
        weights came from, ``text`` the text tower or None.

    Raises:
        ModelError: with a sentence naming the folder or hub id and the reason.
    """
    import transformers
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI and the app say what is loading

    source, hub = _resolve(name)
    local_only = not hub
    if hub:
        from .hub import _hub_reachable

        local_only = not _hub_reachable()
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    except Exception as exc:  # noqa: BLE001 - an unreadable config is the folder's / id's problem
        raise ModelError(f"Model {name!r}: its config could not be read ({first_line(exc)}).") from exc
    from .declared import check_weights

    check_weights(name)  # a hub config fetched just now is sized before from_pretrained builds it
    family = _model_type(config, name, more or {})
    arch = next((a for a in (config.architectures or []) if a in family.heads), family.base)
    from . import text as text_source

    full = text_source.is_full_model(config)
    if full:
        arch = text_source.FULL_MODELS[config.model_type]
    cls = getattr(transformers, arch)
    try:
        model, info = cls.from_pretrained(source, attn_implementation="eager", local_files_only=local_only,
                                          output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - weights that do not fit, a missing weights file
        raise ModelError(f"Model {name!r}: its weights could not be loaded as {arch} ({first_line(exc, 300)}).") from exc
    missing = list(info.get("missing_keys", []))
    mismatched = list(info.get("mismatched_keys", []))
    if missing or mismatched:
        raise ModelError(f"Model {name!r}: its weights do not fit its config ({arch}): {len(missing)} missing keys "
                         f"(e.g. {missing[:3]}), {len(mismatched)} of the wrong shape (e.g. {mismatched[:2]}).")
    model = model.eval().requires_grad_(False).to(device=device, dtype=dtype)
    if full:
        return model.vision_model, family, source, text_source.text_tower(model, source, local_only)
    return model, family, source, None


# ---------------------------------------------------------------------------------------------
# Preprocessing: the model's own image processor, keeping the exact model-input image


@lru_cache(maxsize=8)
def image_processor(source: str):
    """The image processor saved with the model (``preprocessor_config.json``); None without one."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(source, local_files_only=True)
    except Exception:  # noqa: BLE001 - no preprocessor_config.json: the loader says so and uses the config
        return None


def _side(size, key_pair=("height", "width")) -> tuple[int, int] | None:
    h, w = (getattr(size, k, None) if not isinstance(size, dict) else size.get(k) for k in key_pair)
    return (int(h), int(w)) if h and w else None


def data_config(model, source: str) -> tuple[dict, list[str]]:
    """A timm-style data config (``input_size``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``) for the
    model's image processor, plus ``hf_processor`` (where to read it) and notes.

    The timm keys let :func:`vitviz.io.images.model_view` say which part of an upload the model sees;
    :func:`preprocess` runs the processor itself.
    """
    config = vision_config(model.config)
    side = int(config.image_size) if isinstance(config.image_size, int) else int(config.image_size[0])
    processor = image_processor(source)
    notes = []
    if processor is None:
        notes.append(f"No preprocessor_config.json with the model: images are resized to {side} px and "
                     "normalised with mean 0.5, std 0.5 (the ViTImageProcessor defaults).")
        return ({"input_size": (3, side, side), "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                 "crop_pct": 1.0, "crop_mode": "squash", "interpolation": "bilinear", "hf_processor": ""}, notes)
    crop = _side(getattr(processor, "crop_size", None)) if getattr(processor, "do_center_crop", False) else None
    size = getattr(processor, "size", None)
    fixed = _side(size)
    shortest = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
    if crop and shortest:
        input_hw, crop_pct, mode = crop, crop[0] / shortest, "center"
    elif fixed:
        input_hw, crop_pct, mode = crop or fixed, 1.0, "squash"
    else:
        input_hw, crop_pct, mode = (side, side), 1.0, "squash"
    return ({"input_size": (3, *input_hw), "mean": tuple(float(m) for m in processor.image_mean),
             "std": tuple(float(s) for s in processor.image_std), "crop_pct": float(crop_pct), "crop_mode": mode,
             "interpolation": _resample_name(getattr(processor, "resample", None)), "hf_processor": source}, notes)


def _resample_name(resample) -> str:
    try:
        return Image.Resampling(int(resample)).name.lower()
    except (TypeError, ValueError):
        return str(resample)


def preprocess(images: list[Image.Image], data_config: dict):
    """The model's own image processor: (B, 3, H, W) ``pixel_values`` and the exact model-input images.

    The images are the processor's resize and crop with rescaling and normalisation off, so
    overlays line up with the pixels the model saw.
    """
    from ..types import ModelInput

    processor = image_processor(data_config["hf_processor"]) if data_config.get("hf_processor") else None
    if processor is None:
        _, h, w = data_config["input_size"]
        resized = [im.resize((w, h), Image.Resampling.BILINEAR) for im in images]
        x = torch.as_tensor(np.stack([np.asarray(im, dtype=np.float32) / 255 for im in resized])).permute(0, 3, 1, 2)
        mean = torch.tensor(data_config["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(data_config["std"]).view(1, 3, 1, 1)
        return ModelInput(tensor=((x - mean) / std).contiguous(), images=resized)
    tensor = processor(images=images, return_tensors="pt")["pixel_values"].float()
    raw = processor(images=images, return_tensors="pt", do_rescale=False, do_normalize=False)["pixel_values"]
    pixels = raw.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return ModelInput(tensor=tensor, images=[Image.fromarray(p) for p in pixels])
