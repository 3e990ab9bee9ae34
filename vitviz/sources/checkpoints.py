"""What a checkpoint file will take in memory, read from its index before anything is unpacked.

``torch.load(weights_only=True)`` refuses code, not size: a 2 MB ``.pth`` of compressed zeros
unpacks to gigabytes. A PyTorch file is a zip whose central directory declares every record's
uncompressed size; a safetensors file starts with a JSON header giving every tensor's byte
range. Both are read here without decompressing or loading anything.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from ..errors import ModelError, first_line

MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


def declared_bytes(path: Path) -> int:
    """Bytes a checkpoint's contents take once unpacked, from its index; the file size for other formats.

    Raises:
        ModelError: the index is damaged or inconsistent (a sentence naming the file).
    """
    size = path.stat().st_size
    if path.suffix.lower() == ".safetensors":
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"Checkpoint {path.name}: it could not be read (too short for a safetensors file: "
                                 f"{size} bytes).")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(MAX_SAFETENSORS_HEADER, size - 8):
                raise ModelError(f"Checkpoint {path.name}: it could not be read (its safetensors header claims "
                                 f"{header_len} bytes, more than the file holds: {size} bytes).")
            try:
                header = json.loads(f.read(header_len))
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ModelError(f"Checkpoint {path.name}: it could not be read (its safetensors header: "
                                 f"{first_line(exc)}).") from exc
        return max(ends, default=0) + header_len + 8
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                return sum(info.file_size for info in archive.infolist())
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ModelError(f"Checkpoint {path.name}: it could not be read (its zip index: "
                             f"{first_line(exc)}).") from exc
    return size


# ---------------------------------------------------------------------------------------------------
# Reading the weights a training script saved, and the architecture they were trained as.

CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".tar", ".ckpt")
# Where training scripts keep the weights, in timm's order (timm.models.load_state_dict, use_ema=True):
# its train.py saves {"state_dict", "state_dict_ema", "args", ...}; Lightning {"state_dict", ...};
# torchvision's references and many others {"model", "model_ema", ...}; DeepSpeed {"module", ...}.
STATE_DICT_ENTRIES = ("state_dict_ema", "model_ema", "state_dict", "model", "module")


def _safe_globals() -> list:
    """The non-tensor objects training checkpoints hold that unpickle without running code: timm's
    train.py and Lightning keep the command line as an ``argparse.Namespace``."""
    import argparse

    return [argparse.Namespace]


def read_checkpoint(path: Path, max_bytes: int | None = None, needed: str = "") -> object:
    """The object a checkpoint file holds; never unpickles arbitrary objects, never unpacks a bomb.

    Args:
        path: a ``.safetensors`` file, or a ``torch.save`` file (``.pt``, ``.pth``, ``.bin``, ``.tar``, ``.ckpt``)
            read with ``weights_only=True`` (tensors, containers, numbers, strings and ``argparse.Namespace``).
        max_bytes: refuse a file whose contents would take more than this once unpacked (read
            from its index, see :func:`declared_bytes`); None: no limit.
        needed: what the architecture needs, for the sentence (e.g. ``"deit_tiny (22 MiB)"``).

    Raises:
        ModelError: a sentence naming the file and the reason.
    """
    import torch

    from ..settings import megabytes

    # The type is checked before the file system is asked anything: the path box must not tell
    # "exists" from "does not exist" for files that are not checkpoints.
    if path.suffix.lower() not in CHECKPOINT_SUFFIXES:
        raise ModelError(f"Checkpoint {path.name}: unsupported file type; use {', '.join(CHECKPOINT_SUFFIXES)}.")
    if not path.is_file():
        raise ModelError(f"Checkpoint {path}: no such file.")
    if path.stat().st_size == 0:
        raise ModelError(f"Checkpoint {path.name}: it is empty (0 bytes).")
    if max_bytes is not None:
        unpacked = declared_bytes(path)
        if unpacked > max_bytes:
            raise ModelError(f"Checkpoint {path.name}: its contents would take {megabytes(unpacked)} once unpacked, "
                             f"more than {needed or 'the architecture'} can use (at most {megabytes(max_bytes)}); "
                             "vitviz does not unpack it.")
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read a user's file is their file's problem
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            reason = ("it contains Python objects other than tensors, which vitviz refuses to unpickle (unsafe); "
                      "save the weights alone with torch.save(model.state_dict(), path) or as safetensors")
        else:
            reason = f"it could not be read ({first_line(exc)})"
        raise ModelError(f"Checkpoint {path.name}: {reason}.") from exc


def _is_state_dict(obj) -> bool:
    import torch

    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def unwrap_state_dict(obj, name: str, architecture_keys=()) -> tuple[dict, list[str]]:
    """The weights inside what a training script saved, with the keys the architecture uses.

    Takes the first of :data:`STATE_DICT_ENTRIES` that holds a dictionary (nested entries too) and, when
    the keys carry a wrapper's prefix (DataParallel / DDP's ``module.``, torch.compile's ``_orig_mod.``, the
    attribute a LightningModule keeps the network in, ``model.``), keeps the keys under the prefix that
    makes the most of them the architecture's, without it.

    Args:
        obj: what :func:`read_checkpoint` returned.
        name: the file name, for the sentences.
        architecture_keys: the state-dict keys of the architecture the weights are for.

    Returns:
        (state dict, what was done to find it, as phrases for the model's notes).

    Raises:
        ModelError: no dictionary of tensors was found.
    """
    how: list[str] = []
    while isinstance(obj, dict) and not _is_state_dict(obj):
        entry = next((k for k in STATE_DICT_ENTRIES if isinstance(obj.get(k), dict)), None)
        if entry is None:
            keys = ", ".join(repr(k) for k in list(obj)[:8])
            raise ModelError(f"Checkpoint {name}: it is not a dictionary of tensors (a state dict), and none of its "
                             f"entries {', '.join(repr(k) for k in STATE_DICT_ENTRIES)} holds one "
                             f"(it has {keys or 'no entries'}).")
        obj = obj[entry]
        how.append(f"its {entry!r} entry")
    if not _is_state_dict(obj):
        raise ModelError(f"Checkpoint {name}: it is not a dictionary of tensors (a state dict).")
    state = obj
    prefix = _wrapper_prefix(state, set(architecture_keys))
    if prefix:
        state = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
        how.append(f"the keys under {prefix!r}, without it")
    return state, how


def _wrapper_prefix(state: dict, architecture_keys: set[str]) -> str:
    """The prefix (e.g. ``"model."``) that, removed, makes the most keys the architecture's; "" if none helps."""
    counts: dict[str, int] = {}
    for key in state:
        parts = key.split(".")
        for cut in range(1, len(parts)):
            if ".".join(parts[cut:]) in architecture_keys:
                prefix = ".".join(parts[:cut]) + "."
                counts[prefix] = counts.get(prefix, 0) + 1
    if not counts:
        return ""
    best = max(counts, key=counts.get)
    return best if counts[best] > len(architecture_keys & state.keys()) else ""


def _shape(t) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _accepts(model, argument: str) -> bool:
    """Whether the model's class takes ``argument`` in its constructor (timm passes kwargs through)."""
    import inspect

    return argument in inspect.signature(type(model).__init__).parameters


def fit_architecture(state_dict: dict, arch, kwargs: dict) -> dict:
    """The ``timm.create_model`` keyword arguments that make ``arch`` fit the checkpoint's tensor shapes.

    What a training script changes and the weights show: the classifier's outputs (``num_classes``,
    0 for a checkpoint without a head), the pooling (a ``fc_norm`` means average pooling, ``attn_pool``
    attention pooling), a class token and register tokens present or not, and the input resolution
    from a square position-embedding grid (unless ``kwargs`` asks for one: the grid is then resampled).

    Args:
        state_dict: the checkpoint's weights, keys as the architecture names them.
        arch: the architecture built with ``kwargs`` (on the meta device: no memory).
        kwargs: the keyword arguments it was built with.

    Returns:
        ``kwargs`` with what the checkpoint calls for added; equal to ``kwargs`` when it already fits, or
        when most of its tensors have names the architecture does not use (weights of another model).
    """
    import math

    fitted = dict(kwargs)
    own = arch.state_dict()
    if 2 * len(own.keys() & state_dict.keys()) < len(state_dict):
        return fitted  # most of its tensors are not this architecture's: nothing to read sizes from
    head = f"{_classifier_name(arch)}.weight"
    classes = int(state_dict[head].shape[0]) if head in state_dict else 0
    if classes != getattr(arch, "num_classes", classes):
        fitted["num_classes"] = classes

    if _accepts(arch, "class_token") and ("cls_token" in state_dict) != ("cls_token" in own):
        fitted["class_token"] = "cls_token" in state_dict
    registers = int(state_dict["reg_token"].shape[1]) if "reg_token" in state_dict else 0
    if _accepts(arch, "reg_tokens") and registers != getattr(arch, "num_reg_tokens", registers):
        fitted["reg_tokens"] = registers

    if _accepts(arch, "global_pool"):
        pools = {"map": any(k.startswith("attn_pool.") for k in state_dict), "avg": "fc_norm.weight" in state_dict}
        own_pools = {"map": any(k.startswith("attn_pool.") for k in own), "avg": "fc_norm.weight" in own}
        if pools != own_pools:
            pool = next((p for p in ("map", "avg") if pools[p]), "token" if "cls_token" in state_dict else "avg")
            fitted["global_pool"] = pool

    pos_embed, patch_embed = state_dict.get("pos_embed"), getattr(arch, "patch_embed", None)
    if ("img_size" not in kwargs and pos_embed is not None and pos_embed.ndim == 3 and "pos_embed" in own
            and hasattr(patch_embed, "patch_size") and _accepts(arch, "img_size")):
        prefix = 0 if getattr(arch, "no_embed_class", False) else \
            int("cls_token" in state_dict) + registers
        cells = pos_embed.shape[1] - prefix
        side = math.isqrt(max(cells, 0))
        patch = patch_embed.patch_size[0]
        if side * side == cells and side > 0 and tuple(patch_embed.grid_size) != (side, side):
            fitted["img_size"] = side * patch
    return fitted


def _classifier_name(arch) -> str:
    """The classifier's module name (``head``, Swin's ``head.fc``): the module timm's ``get_classifier()``
    returns (an ``Identity`` too, when the architecture has no head by default); else the pretrained config's."""
    classifier = arch.get_classifier() if hasattr(arch, "get_classifier") else None
    if isinstance(classifier, tuple):  # distilled DeiT: (head, head_dist), both num_classes wide
        classifier = classifier[0]
    found = next((name for name, module in arch.named_modules() if module is classifier and name), None)
    configured = (getattr(arch, "pretrained_cfg", None) or {}).get("classifier", "head")
    return found or (configured[0] if isinstance(configured, (tuple, list)) else configured)


def describe_fit(kwargs: dict, fitted: dict) -> str:
    """What :func:`fit_architecture` changed, as a phrase: ``"num_classes=7, img_size=384"``; "" for nothing."""
    return ", ".join(f"{k}={v}" for k, v in fitted.items() if kwargs.get(k, object()) != v)


def first_mismatch(state_dict: dict, model) -> str | None:
    """A sentence naming the first tensor that keeps ``state_dict`` from loading into ``model``, or None.

    The first of the model's tensors (in its own order) with another shape in the checkpoint or absent
    from it; else the first checkpoint tensor the model has no place for.
    """
    own = model.state_dict()
    for key, value in own.items():
        if key not in state_dict:
            return f"the architecture's tensor {key!r} {_shape(value)} is not in the checkpoint"
        if tuple(state_dict[key].shape) != tuple(value.shape):
            return (f"its tensor {key!r} has shape {_shape(state_dict[key])}, the architecture's "
                    f"{_shape(value)}")
    extra = next((k for k in state_dict if k not in own), None)
    if extra is not None:
        return f"its tensor {extra!r} {_shape(state_dict[extra])} has no place in the architecture"
    return None
