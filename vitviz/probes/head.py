"""A probe file attached to a loaded model: the backbone gains the probe's classes (:class:`ProbedModel`).

The probe must have been trained on this backbone: the model name, checkpoint file name and the SHA-256 of its
weights (when both ran in the same precision) are compared with the ones the probe recorded; the probe's layer must
exist and its weight must fit the pooled vector. Anything else is refused with a sentence naming both.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelError
from .features import POOLINGS, weights_sha256
from .probe import INFO, METADATA_KEY


@dataclass(frozen=True)
class ProbeFile:
    """A probe as read from disk: ``weight`` (K, F), ``bias`` (K,) and its description (probe.json's content)."""

    path: Path
    weight: torch.Tensor
    bias: torch.Tensor
    info: dict

    @property
    def layer(self) -> int:
        """0-based."""
        return int(self.info["layer"]) - 1

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.info["classes"])


def read_probe(path: str | Path) -> ProbeFile:
    """Read ``probe.safetensors`` (its description from its metadata, else from ``probe.json`` beside it).

    Raises:
        ModelError: not a probe file (the sentence names it and says what is missing).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"Head {path} does not exist: --head names a probe.safetensors from `python -m vitviz probe`.")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata, names = f.metadata() or {}, set(f.keys())
            tensors = {k: f.get_tensor(k) for k in ("weight", "bias") if k in names}
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: say so
        raise ModelError(f"Head {path.name} is not a safetensors file ({exc}).") from None
    if set(tensors) != {"weight", "bias"}:
        raise ModelError(f"Head {path.name} has no {' and '.join(sorted({'weight', 'bias'} - set(tensors)))} tensor: "
                         "a probe file holds weight (K, D) and bias (K,).")
    try:
        if METADATA_KEY in metadata:
            info = json.loads(metadata[METADATA_KEY])
        elif (path.parent / INFO).is_file():
            info = json.loads((path.parent / INFO).read_text())
        else:
            raise ModelError(f"Head {path.name} does not say which model, layer and pooling it was trained on (no "
                             f"{METADATA_KEY} metadata and no {INFO} beside it).")
    except (ValueError, OSError) as exc:
        raise ModelError(f"Head {path.name}: its description cannot be read as JSON ({exc}).") from None
    if isinstance(info, dict) and info.get("kind") == "patch":
        raise ModelError(f"Head {path.name} is a patch probe of a painted concept (probe --patch-masks): it scores "
                         "patches, not images, so it is no head; explain it with vitviz.ConceptTarget instead.")
    weight, bias = tensors["weight"], tensors["bias"]
    missing = [k for k in ("model", "layer", "pooling", "classes") if k not in info] if isinstance(info, dict) else [
        "everything"]
    if missing or info.get("pooling") not in POOLINGS or not isinstance(info["model"], dict) \
            or not isinstance(info["layer"], int):
        raise ModelError(f"Head {path.name}'s description lacks {', '.join(missing) or 'a known pooling'}.")
    if weight.ndim != 2 or bias.shape != (weight.shape[0],) or len(info["classes"]) != weight.shape[0]:
        raise ModelError(f"Head {path.name}: weight {tuple(weight.shape)}, bias {tuple(bias.shape)} and "
                         f"{len(info['classes'])} classes do not make one linear layer.")
    return ProbeFile(path, weight, bias, info | {"file": path.name})


def _names(model: dict) -> str:
    """A model as its label says it, with its name where the label does not carry it."""
    label, name = model.get("label") or model.get("name"), model.get("name")
    return label if name in label else f"{label} ({name})"


def check_fits(probe: ProbeFile, loaded, identity: dict, widths: dict) -> None:
    """Refuse a probe trained on another backbone or on a layer this one does not have.

    Args:
        identity: this backbone's :func:`vitviz.probes.probe.model_identity`.
        widths: pooling -> the width of this backbone's pooled features.
    """
    trained = probe.info["model"]
    here = _names(identity | {"label": loaded.label})
    if (trained.get("name"), trained.get("checkpoint")) != (identity["name"], identity["checkpoint"]) or (
            trained.get("dtype") == identity["dtype"] and trained.get("weights_sha256") != identity["weights_sha256"]):
        same = "the same name but other weights" if trained.get("name") == identity["name"] else "another model"
        raise ModelError(f"Head {probe.path.name} was trained on {_names(trained)}, not on {here} ({same}): a probe "
                         "only reads the features of the backbone it was trained on.")
    depth = identity["num_layers"]
    if not 0 <= probe.layer < depth:
        raise ModelError(f"Head {probe.path.name} reads layer {probe.layer + 1}, but {here} has layers 1 to {depth}.")
    dim = widths[probe.info["pooling"]]
    if probe.weight.shape[1] != dim:
        raise ModelError(f"Head {probe.path.name} takes {probe.weight.shape[1]} features, but {probe.info['pooling']} "
                         f"pooling at layer {probe.layer + 1} of {here} gives {dim}.")


# model object -> (its identity, {pooling: feature width}): a cached backbone is hashed and measured once, so
# attaching a head on every app rerun costs a file read
_BACKBONES: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[dict, dict]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _backbone_facts(loaded) -> tuple[dict, dict]:
    from ..trace import trace_model
    from .probe import model_identity

    with _LOCK:
        found = _BACKBONES.get(loaded.model)
    if found is not None and found[0]["name"] == loaded.spec.name:
        return found
    # The widths from one forward of a blank image, through the adapters (vitviz.lens imports this module through
    # the loader, so no Lens here).
    param = next(loaded.model.parameters())
    blank = torch.zeros(1, 3, *loaded.data_config["input_size"][-2:], device=param.device, dtype=param.dtype)
    with torch.inference_mode():
        points = trace_model(loaded.model, blank, keep=("final_norm", "pooled"), grad=None)
    d, p = points["final_norm"].shape[-1], points["pooled"].shape[-1]
    facts = (model_identity(loaded), {"cls": p, "mean": d, "cls+mean": p + d})
    with _LOCK:
        _BACKBONES[loaded.model] = facts
    return facts


def attach_head(loaded, head: str | Path):
    """``loaded`` (a :class:`vitviz.sources.models.LoadedModel`) with the probe of ``head`` as its classifier: the same
    backbone object (nothing copied), its spec naming the head.

    Raises:
        ModelError: not a probe file, or a probe trained on another model or a layer it does not have.
    """
    from ..adapters.probe_head import ProbedModel

    if loaded.attention_scope != "global":
        raise ModelError(f"{loaded.label} attends within windows: probes read models whose every layer has the same "
                         "tokens, so it cannot take a probe head.")
    probe = read_probe(head)
    check_fits(probe, loaded, *_backbone_facts(loaded))
    model = ProbedModel(loaded.model, probe.weight, probe.bias, probe.layer, probe.info["pooling"], probe.classes,
                        probe.info)
    classes = ", ".join(probe.classes[:5]) + (", ..." if len(probe.classes) > 5 else "")
    label = (f"{loaded.label} + probe head ({len(probe.classes)} classes: {classes}; layer {probe.layer + 1}, "
             f"{probe.info['pooling']} pooling)")
    note = (f"Head: the probe in {probe.path.name}, on layer {probe.layer + 1} of {loaded.adapter.num_layers(loaded.model)} "
            f"({probe.info['pooling']} pooling); the model is the backbone's first {probe.layer + 1} blocks and the probe.")
    kept = [n for n in loaded.notes if not n.startswith("No classifier head")]  # it has one now
    return dataclasses.replace(loaded, model=model, spec=dataclasses.replace(loaded.spec, head=str(head)), label=label,
                               notes=[*kept, note])
