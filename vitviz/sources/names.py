"""What a model name names: the one place a ``--model`` string (or the sidebar's box) is interpreted."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED = "bundled"
HF_PREFIX = "hf:"
TORCHVISION_PREFIX = "torchvision:"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from.

    Attributes:
        kind: ``"bundled"``, ``"timm"`` (a timm model name, optionally with its pretrained tag),
            ``"transformers"`` (a ``save_pretrained`` folder, or a hub id written ``hf:owner/name``) or
            ``"torchvision"`` (a torchvision builder written ``torchvision:vit_b_16``, optionally with the name of
            its weights: ``torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1``).
        name: the name as typed.
        hub_id: the hub id of an ``hf:`` name, else None.
        builder: the torchvision builder of a ``torchvision:`` name, else None.
        weights: the torchvision weights named after the builder, else None.
    """

    kind: str
    name: str
    hub_id: str | None = None
    builder: str | None = None
    weights: str | None = None

    @property
    def folder(self) -> Path | None:
        """The local folder of a transformers model named by its path, else None."""
        return Path(self.name).expanduser() if self.kind == "transformers" and self.hub_id is None else None


def canonical_model_name(name: str) -> str:
    """The one name of a model, as the ``stats`` command writes it in a table's model column.

    The app's in-session runs, typed names and read tables all go through this, so one model is not
    listed twice (the bundled model once appeared as ``bundled`` from a table and as its long label
    from an in-app run): surrounding spaces go, an ``hf:`` id loses spaces after the prefix, and
    anything else is kept as typed (timm names and folders are case- and path-sensitive).
    """
    source = parse_model_name(name.strip())
    return f"{HF_PREFIX}{source.hub_id}" if source.hub_id is not None else source.name


def parse_model_name(name: str) -> ModelSource:
    """``"bundled"``; ``"torchvision:builder[.WEIGHTS]"``: torchvision; ``"hf:owner/name"`` or anything path-like
    (a ``/``, a ``\\`` or an existing folder): transformers; anything else: a timm name."""
    if name == BUNDLED:
        return ModelSource("bundled", name)
    if name.startswith(TORCHVISION_PREFIX):
        builder, _, weights = name[len(TORCHVISION_PREFIX):].strip().partition(".")
        return ModelSource("torchvision", name, builder=builder, weights=weights or None)
    if name.startswith(HF_PREFIX):
        return ModelSource("transformers", name, name[len(HF_PREFIX):].strip())
    if "/" in name or "\\" in name or Path(name).expanduser().is_dir():
        return ModelSource("transformers", name)
    return ModelSource("timm", name)
