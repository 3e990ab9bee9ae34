"""The one registry of model families (the shape of timm's ``register_model``).

An adapter module registers its class with ``@register_adapter``; :func:`adapter_for` finds the
adapter that claims a built model. Nothing outside ``vitviz/adapters`` asks what family a model is.
"""
from __future__ import annotations

import importlib
import threading

import torch

from .base import Adapter

ADAPTERS: dict[str, Adapter] = {}
_BY_TYPE: dict[type, Adapter] = {}
_LOCK = threading.Lock()
# The family modules, in the order they are asked to claim a model.
FAMILY_MODULES = ("timm_vit", "timm_relpos", "timm_swin", "hf_vit", "hf_dinov2", "hf_clip", "hf_beit", "hf_dinov3",
                  "hf_swin", "hf_swinv2", "tv_vit", "probe_head")
_loaded = False


def load_all() -> None:
    """Import every family module once, so each registers its adapter."""
    global _loaded
    if not _loaded:
        for name in FAMILY_MODULES:
            importlib.import_module(f"{__package__}.{name}")
        _loaded = True


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: register one instance of ``cls`` under ``cls.name`` (registration order is
    the order adapters are asked to claim a model)."""
    if not cls.name or cls.name in ADAPTERS:
        raise ValueError(f"adapter name {cls.name!r} is empty or registered twice")
    ADAPTERS[cls.name] = cls()
    return cls


def find_adapter(model: torch.nn.Module) -> Adapter | None:
    """The adapter that claims ``model``, or None."""
    load_all()
    found = _BY_TYPE.get(type(model))
    if found is not None and found.claims(model):
        return found
    found = next((a for a in ADAPTERS.values() if a.claims(model)), None)
    if found is not None:
        with _LOCK:
            _BY_TYPE[type(model)] = found
    return found


def adapter_for(model: torch.nn.Module) -> Adapter:
    """The adapter that claims ``model``.

    Raises:
        ValueError: no registered adapter claims it (a programming error: loaders refuse such models
            with :func:`why_unsupported` first).
    """
    found = find_adapter(model)
    if found is None:
        raise ValueError(f"no vitviz adapter reads a {type(model).__name__}")
    return found


def why_unsupported(model: torch.nn.Module) -> str | None:
    """Why no adapter reads this model exactly (a sentence fragment), or None when one does."""
    found = find_adapter(model)
    if found is None:
        return f"it is a {type(model).__name__}, which no vitviz adapter reads"
    return found.why_unsupported(model)


def hf_model_types() -> dict:
    """Every transformers ``model_type`` some adapter reads -> its :class:`vitviz.types.HFModelType`."""
    load_all()
    return {t: spec for a in ADAPTERS.values() for t, spec in a.hf_model_types.items()}


def hf_config_architecture(config):
    """What fixes the attention's size for a transformers config, from the adapter that lists its ``model_type``
    (:meth:`Adapter.config_architecture`), or None (the caller reads the usual ViT fields)."""
    load_all()
    model_type = getattr(config, "model_type", None)
    return next((a.config_architecture(config) for a in ADAPTERS.values() if model_type in a.hf_model_types), None)


def supported_families() -> str:
    """The families the adapters read, in words (the "not supported yet" sentence names them)."""
    load_all()
    return "; ".join(a.families for a in ADAPTERS.values() if a.families)
