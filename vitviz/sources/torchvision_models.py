"""torchvision's Vision Transformers (``torchvision:vit_b_16``): build, read local weights, preprocess.

A name is a torchvision builder, optionally followed by the name of its weights
(``torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1``; default the builder's ``DEFAULT``). The model is always built
with ``weights=None`` and then given weights read by vitviz (:func:`vitviz.sources.checkpoints.read_checkpoint`:
safetensors or ``torch.load(weights_only=True)``):

- with ``--checkpoint FILE``: a ``torch.save(model.state_dict())`` file (or torchvision's reference scripts'
  ``{"model": ...}``); the number of classes, the input size and a pre-logits layer are read from its tensor
  shapes, and ``img_size`` resamples the position embedding with torchvision's own ``interpolate_embeddings``;
- without: the named weights from torch hub's cache, or downloaded from download.pytorch.org when the user
  asked for them and the server answers (never offline: a sentence says so).

Preprocessing is torchvision's transform of the weights (``weights.transforms()``: resize the shorter side,
centre crop, ImageNet mean and std): for ``vit_b_16`` at 224 px, ``IMAGENET1K_V1``'s resize to 256 bilinear
and crop 224. It is written as a timm data config, which :func:`vitviz.sources.preprocess.preprocess` runs with the same
torchvision operations. How the model runs and is read is its adapter's (:mod:`vitviz.adapters.tv_vit`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelError, first_line
from .names import parse_model_name

DOWNLOAD_HOST = ("download.pytorch.org", 443)
# torchvision's ImageNet evaluation transform for a model without named weights of its size:
# resize the shorter side to size / 0.875 (bilinear), centre crop, ImageNet mean and std.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875


@dataclass(frozen=True)
class Built:
    """A torchvision model with its weights.

    Attributes:
        model: the ``VisionTransformer`` (eval mode not yet set).
        source: where the weights came from, in words.
        label: the model's name for figures.
        data_config: the preprocessing as a timm data config.
        notes: what was read or fitted, as sentences for the model's notes.
    """

    model: torch.nn.Module
    source: str
    label: str
    data_config: dict
    notes: list[str]


def _builder(name: str):
    """The torchvision builder a ``torchvision:`` name names, and the name without the prefix.

    Raises:
        ModelError: torchvision is missing or has no builder of that name.
    """
    source = parse_model_name(name)
    try:
        import torchvision.models as tvm
    except ImportError as exc:
        raise ModelError(f"Model {name!r}: torchvision is not installed ({first_line(exc)}).") from exc
    try:
        return tvm.get_model_builder(source.builder), source
    except ValueError:
        vits = ", ".join(n for n in tvm.list_models(module=tvm) if n.startswith("vit"))
        raise ModelError(f"Model {name!r}: torchvision has no model {source.builder!r}; its Vision Transformers are "
                         f"{vits}.") from None


def _weights_enum(builder):
    """The builder's weights enum, or None for a builder without named weights (a user's own)."""
    from torchvision.models import get_model_weights

    try:
        return get_model_weights(builder)
    except (ValueError, KeyError, TypeError):
        return None


def _named_weights(name: str, builder, source):
    """The weights a name asks for (``.WEIGHTS`` after the builder, else its ``DEFAULT``), or None when it has none."""
    enum = _weights_enum(builder)
    if enum is None:
        if source.weights:
            raise ModelError(f"Model {name!r}: the builder {source.builder!r} has no named weights.")
        return None
    if source.weights is None:
        return enum.DEFAULT
    try:
        return enum[source.weights]
    except KeyError:
        raise ModelError(f"Model {name!r}: torchvision has no weights {source.weights!r} for {source.builder}; "
                         f"it has {', '.join(w.name for w in enum)}.") from None


def meta_architecture(name: str, **kwargs) -> torch.nn.Module:
    """The architecture alone, on the meta device (no memory), built with ``weights=None`` and ``kwargs``.

    Raises:
        ModelError: torchvision cannot build it so.
    """
    builder, _ = _builder(name)
    try:
        with torch.device("meta"):
            return builder(weights=None, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ModelError(f"Model {name!r} cannot be built with {kwargs or 'its defaults'}: {first_line(exc)}.") from exc


def _fit_kwargs(state: dict, model: torch.nn.Module, img_size: int | None) -> tuple[dict, dict]:
    """(builder arguments, state) for weights trained with other classes, input size or a pre-logits layer.

    The number of classes is the head's rows; the input size is the one the position embedding was trained at,
    unless ``img_size`` asks for another (then the embedding is resampled as torchvision does it).
    """
    from torchvision.models.vision_transformer import interpolate_embeddings

    kwargs = {}
    head = state.get("heads.head.weight")
    if head is not None and head.ndim == 2 and head.shape[0] != model.num_classes:
        kwargs["num_classes"] = int(head.shape[0])
    pre = state.get("heads.pre_logits.weight")
    if pre is not None and pre.ndim == 2 and model.representation_size != pre.shape[0]:
        kwargs["representation_size"] = int(pre.shape[0])
    pos = state.get("encoder.pos_embedding")
    if pos is not None and pos.ndim == 3:
        side = int(round((pos.shape[1] - 1) ** 0.5))
        trained = side * model.patch_size if side * side == pos.shape[1] - 1 else None
        wanted = img_size or trained
        if wanted is not None and wanted != model.image_size:
            kwargs["image_size"] = wanted
        if img_size is not None and trained is not None and img_size != trained:
            state = interpolate_embeddings(img_size, model.patch_size, dict(state))
    elif img_size is not None and img_size != model.image_size:
        kwargs["image_size"] = img_size
    return kwargs, state


def data_config(image_size: int, weights, enum) -> tuple[dict, str]:
    """The preprocessing of a model at ``image_size`` px as a timm data config, and its description.

    torchvision's transform of ``weights`` when they run at this size, else of the builder's ``DEFAULT``, else of
    the first of its weights (``enum``, None for a builder without any) that do, else torchvision's ImageNet
    evaluation default (resize to size / 0.875 bilinear, centre crop).
    """
    candidates = ([weights] if weights is not None else []) + ([enum.DEFAULT] if enum is not None else []) + \
        (list(enum) if enum is not None else [])
    for w in candidates:
        t = w.transforms()
        if t.crop_size[0] == image_size:
            config = {"input_size": (3, image_size, image_size), "interpolation": t.interpolation.value,
                      "mean": tuple(t.mean), "std": tuple(t.std), "crop_pct": image_size / t.resize_size[0],
                      "crop_mode": "center"}
            return config, (f"torchvision's {w.name} transform (resize the shorter side to {t.resize_size[0]} px "
                            f"{t.interpolation.value}, centre crop {image_size} px, ImageNet mean and std)")
    resize = int(image_size / DEFAULT_CROP_PCT)
    config = {"input_size": (3, image_size, image_size), "interpolation": "bilinear", "mean": IMAGENET_MEAN,
              "std": IMAGENET_STD, "crop_pct": image_size / resize, "crop_mode": "center"}
    return config, (f"torchvision's ImageNet evaluation transform (resize the shorter side to {resize} px bilinear, "
                    f"centre crop {image_size} px, ImageNet mean and std)")


def _cached_or_downloaded(name: str, weights) -> Path:
    """The file of torchvision's named ``weights``: torch hub's cache, else downloaded when the server answers.

    Raises:
        ModelError: not cached and offline or unreachable, or the download failed.
    """
    from .hub import host_reachable

    path = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    if path.is_file():
        return path
    if not host_reachable(DOWNLOAD_HOST):
        raise ModelError(f"Model {name!r} could not be loaded: its weights {weights.name} are not in torch hub's cache "
                         f"({path}) and {DOWNLOAD_HOST[0]} cannot be reached (no internet, or offline mode). Give "
                         "a local file of its weights with --checkpoint (torch.save(model.state_dict(), path)).")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # torchvision's file names end in the first digits of their SHA-256, which the download checks
        prefix = path.stem.rsplit("-", 1)[-1]
        torch.hub.download_url_to_file(weights.url, str(path), hash_prefix=prefix, progress=False)
    except Exception as exc:  # noqa: BLE001 - network errors alike mean "no weights"
        raise ModelError(f"Model {name!r} could not be loaded: downloading its weights {weights.name} failed "
                         f"({first_line(exc)}). Give a local file of its weights with --checkpoint.") from exc
    return path


def build(name: str, checkpoint: str | None = None, img_size: int | None = None,
          max_bytes=lambda weights: None) -> Built:
    """A torchvision Vision Transformer with local weights (see the module's docstring).

    Args:
        name: ``torchvision:builder[.WEIGHTS]``.
        checkpoint: a state-dict file; None: the named weights (cache, else download).
        img_size: input resolution; None: the size the weights were trained at.
        max_bytes: float32 bytes of the architecture -> the most a checkpoint file may unpack to.

    Raises:
        ModelError: a sentence naming the model or file and the reason.
    """
    from .checkpoints import first_mismatch, read_checkpoint, unwrap_state_dict

    builder, source = _builder(name)
    weights = _named_weights(name, builder, source)
    architecture = meta_architecture(name)
    own = sum(t.numel() for t in architecture.state_dict().values()) * 4
    if not checkpoint and weights is None:
        raise ModelError(f"Model {name!r}: the builder {source.builder!r} has no named weights; give a file of its "
                         "weights with --checkpoint (torch.save(model.state_dict(), path)).")
    path = Path(checkpoint).expanduser() if checkpoint else _cached_or_downloaded(name, weights)
    saved = read_checkpoint(path, max_bytes(own), needed=f"{source.builder} ({own / (1 << 20):.0f} MiB of float32 "
                                                          "weights)")
    state, how = unwrap_state_dict(saved, path.name, architecture.state_dict().keys())
    kwargs, state = _fit_kwargs(state, architecture, img_size)
    model = meta_architecture(name, **kwargs)
    mismatch = first_mismatch(state, model)
    if mismatch:
        built = f"{source.builder} ({', '.join(f'{k}={v}' for k, v in kwargs.items())})" if kwargs else source.builder
        raise ModelError(f"Checkpoint {path.name} does not fit torchvision's {built}: {mismatch}.")
    model = builder(weights=None, **kwargs)
    model.load_state_dict(state, strict=True)
    # A checkpoint's transform is that of the weights the name spells out, else of the builder's own at its size.
    named = weights if not checkpoint or source.weights else None
    config, how_preprocessed = data_config(model.image_size, named, _weights_enum(builder))
    notes = [f"Preprocessing: {how_preprocessed}."]
    if how:
        notes.append(f"Weights read from {path.name}: {'; '.join(how)}.")
    if kwargs:
        notes.append(f"Built as {source.builder} with {', '.join(f'{k}={v}' for k, v in kwargs.items())}, as the "
                     "weights' tensor shapes say" + (" and the input resolution asks." if "image_size" in kwargs and
                                                     img_size else "."))
    if checkpoint:
        where, label = f"local file {path}", f"torchvision {source.builder} with weights from {path.name}"
    else:
        where, label = f"torchvision weights {weights.name} ({path})", f"torchvision {source.builder} ({weights.name})"
    return Built(model, where, label, config, notes)


def declared_bytes(name: str, img_size: int | None = None) -> int | None:
    """The float32 bytes of the architecture's parameters (built on the meta device), or None when it cannot
    be built (the loader says why)."""
    try:
        model = meta_architecture(name, **({"image_size": img_size} if img_size else {}))
    except ModelError:
        return None
    return sum(t.numel() for t in model.state_dict().values()) * 4
