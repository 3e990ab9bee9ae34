"""Load a model: the bundled default, any timm ViT by name, a local checkpoint, a Hugging Face
transformers model (a ``save_pretrained`` folder or an ``hf:`` hub id, see :mod:`vitviz.sources.hf`) or a torchvision
ViT (``torchvision:vit_b_16``, see :mod:`vitviz.sources.torchvision_models`).

All model construction and mutation happens here, once per :class:`ModelSpec`; the result is
shared read-only (the app caches one per spec for every session and thread). Where timm's pretrained weights are
cached, and their download, are :mod:`vitviz.sources.timm_weights`.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from . import bundled
from ..errors import ModelError
from .hub import _hub_reachable
from .labels import ClassNames
from .names import BUNDLED, parse_model_name
from .timm_weights import (_download_weights, _local_weights, _unknown_model_error, search_models,
                           weights_on_disk)
from ..layout import TokenLayout
from ..types import NativePosEmbed

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelSpec:
    """What to load. Hashable, so it can key a cache.

    Args:
        name: ``"bundled"``, a timm model name, optionally with its pretrained tag
            (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``), a folder saved with transformers'
            ``save_pretrained``, a transformers hub id as ``"hf:google/vit-base-patch16-224"`` or a torchvision
            builder as ``"torchvision:vit_b_16"``.
        checkpoint: path of local weights for ``name``'s architecture (.safetensors, or .pth, .pt, .bin, .tar,
            .ckpt as training scripts save them; :mod:`vitviz.sources.checkpoints`).
        img_size: input resolution in pixels (square); default the model's own.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        dtype: ``"float32"``, or ``"float16"`` / ``"bfloat16"`` on a GPU.
        labels: names of the classifier's outputs (``--labels FILE``, :mod:`vitviz.sources.labels`); None: the
            model's own (transformers ``id2label``, ImageNet by count) or "class i".
        head: a probe file (``probe.safetensors`` from ``python -m vitviz probe``) that becomes the model's
            classifier (:func:`vitviz.probes.head.attach_head`); None: the model's own head, if any.
    """

    name: str = BUNDLED
    checkpoint: str | None = None
    img_size: int | None = None
    device: str = "auto"
    dtype: str = "float32"
    labels: ClassNames | None = None
    head: str | None = None


@dataclass
class LoadedModel:
    """A model ready to run (:class:`vitviz.Lens` wraps one), with what the UI needs to describe it."""

    model: torch.nn.Module
    spec: ModelSpec
    layout: TokenLayout
    data_config: dict
    weights_source: str
    label: str
    device: torch.device
    dtype: torch.dtype
    notes: list[str] = field(default_factory=list)
    native_pos_embed: NativePosEmbed | None = None  # the stored grid, before fitting to img_size
    text: object | None = None  # a CLIP model's text tower and projections (vitviz.sources.text.TextTower)

    @property
    def adapter(self):
        """The family adapter that runs and reads this model (:mod:`vitviz.adapters`)."""
        from ..adapters import adapter_for

        return adapter_for(self.model)

    @property
    def library(self) -> str:
        return self.adapter.library

    @property
    def attention_scope(self) -> str:
        """``"global"``: every token attends to every token, attention is (L, H, N, N) (vitviz.trace);
        ``"window"``: attention inside local windows per block (Swin). Pages ask :meth:`why_not`, not the family."""
        return self.adapter.scope

    def why_not(self, view: str) -> str | None:
        """One sentence saying why ``view`` (:data:`vitviz.adapters.VIEWS`) does not apply to this model, or None."""
        return self.adapter.why_not(self.model, view)

    @property
    def num_classes(self) -> int:
        return self.adapter.num_classes(self.model)

    @property
    def class_labels(self) -> tuple[str, ...] | None:
        """The spec's class names (``--labels``), else the model's own (transformers ``config.id2label``);
        None: by count (ImageNet) or none."""
        return self.spec.labels.names if self.spec.labels else self.adapter.class_labels(self.model)

    @property
    def has_head(self) -> bool:
        return self.num_classes > 0

    @property
    def position_encoding(self) -> str:
        """How the model encodes position, in words (e.g. "learned absolute position embedding + rotary
        position embedding (RoPE) on q and k")."""
        return self.adapter.position_encoding(self.model)

    def card(self) -> dict:
        """Facts about the model for a model card or settings.json."""
        m = self.model
        common = {"model": self.spec.name, "label": self.label, "weights_source": self.weights_source,
                  "parameters": sum(p.numel() for p in m.parameters()), "num_classes": self.num_classes,
                  "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                  "data_config": dict(self.data_config), "token_layout": self.layout.to_dict(),
                  "position_encoding": self.position_encoding,
                  "spec": asdict(self.spec)}
        return common | self.adapter.card(m)


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else MPS, else CPU. A named device that is absent is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelError(f"Device {name!r} is not a device name (use auto, cpu, cuda or mps).") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"Device {name!r} was asked for, but this machine has no CUDA GPU; use auto or cpu.")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelError(f"Device {name!r} was asked for, but MPS is not available here; use auto or cpu.")
    return device


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name not in DTYPES:
        raise ModelError(f"Precision {name!r} is not one of {', '.join(DTYPES)}.")
    if name != "float32" and device.type == "cpu":
        raise ModelError(f"Precision {name} is for GPUs; on the CPU vitviz runs float32.")
    return DTYPES[name]


def check_supported(model: torch.nn.Module, name: str) -> None:
    """Raise ModelError unless an adapter reads this model's attention exactly (see :mod:`vitviz.adapters`)."""
    from ..adapters import supported_families, why_unsupported

    why = why_unsupported(model)
    if why:
        raise ModelError(f"Model {name!r} is not supported yet: {why}. vitviz reads attention from "
                         f"{supported_families()}; Hugging Face models through the Hugging Face source.")


def _data_config(model: torch.nn.Module) -> dict:
    from timm.data import resolve_model_data_config

    config = resolve_model_data_config(model)
    config["input_size"] = (3, *model.patch_embed.img_size)
    return config


def _finish(model, spec: ModelSpec, weights_source: str, label: str, notes: list[str],
            native_pos_embed: NativePosEmbed | None = None, data_config: dict | None = None) -> LoadedModel:
    device = resolve_device(spec.device)
    dtype = _resolve_dtype(spec.dtype, device)
    check_supported(model, spec.name)
    model = model.eval().requires_grad_(False).to(device=device, dtype=dtype)
    from ..adapters import adapter_for

    layout = adapter_for(model).layout(model)
    return LoadedModel(model=model, spec=spec, layout=layout,
                       data_config=data_config or _data_config(model), weights_source=weights_source,
                       label=label, device=device, dtype=dtype, notes=notes, native_pos_embed=native_pos_embed)


def _timm_native_pos_embed(model, pos_embed, name: str = "") -> NativePosEmbed | None:
    """Stored ``pos_embed`` rows with the settings timm's ``checkpoint_filter_fn`` resamples them with.

    ``name``: the timm model name for pretrained weights (timm picks the filter per name); empty for
    local checkpoints, which :func:`_filter_checkpoint` fits with the filter's defaults.
    """
    # timm's _create_vision_transformer: FlexiViT weights bilinear without antialias, all others bicubic with.
    interpolation, antialias = ("bilinear", False) if "flexi" in name else ("bicubic", True)
    prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
    return NativePosEmbed.from_weights(pos_embed, prefix, interpolation=interpolation, antialias=antialias)


def _img_size_kwargs(img_size: int | None) -> dict:
    if img_size is None:
        return {}
    if not 16 <= img_size <= 2048:
        raise ModelError(f"Input resolution {img_size} px is outside 16..2048.")
    return {"img_size": img_size}


def _load_bundled(spec: ModelSpec) -> LoadedModel:
    import timm

    if spec.checkpoint:
        raise ModelError("A checkpoint file needs a timm architecture name, not 'bundled'.")
    img_size = spec.img_size or bundled.ONNX_INPUT_SIZE
    if img_size % bundled.PATCH_SIZE:
        raise ModelError(f"Input resolution {img_size} px is not a multiple of the bundled model's "
                         f"patch size {bundled.PATCH_SIZE}.")
    model = timm.create_model(bundled.TIMM_ARCH, pretrained=False, num_classes=0, **_img_size_kwargs(img_size))
    state, where = bundled.load_state_dict()
    native = NativePosEmbed.from_weights(state["pos_embed"], 1, bundled.NATIVE_GRID, "bicubic", antialias=False)
    state["pos_embed"] = bundled.resample_pos_embed(state["pos_embed"], model.patch_embed.grid_size)
    model.load_state_dict(state, strict=True)
    return _finish(model, spec, where, bundled.LABEL,
                   ["No classifier head: class-specific views need another model."], native)


# A checkpoint may hold more than the weights (an EMA copy, optimizer moments): up to this many
# times the architecture's float32 weights, plus a little for metadata, is read; more is refused.
CHECKPOINT_SLACK = 4
CHECKPOINT_EXTRA_BYTES = 64 << 20


def _filter_checkpoint(state: dict, model: torch.nn.Module) -> dict:
    """Adapt weights to the model (position embedding resampled to its grid) as timm does."""
    module = importlib.import_module(type(model).__module__)
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    if filter_fn is None:
        from timm.models.vision_transformer import checkpoint_filter_fn as filter_fn
    return filter_fn(state, model)


def _load_timm_checkpoint(spec: ModelSpec, kwargs: dict) -> LoadedModel:
    """A timm architecture with a local checkpoint's weights, fitted to what its training script changed
    (classes, pooling, prefix tokens, resolution: :func:`vitviz.sources.checkpoints.fit_architecture`)."""
    import timm

    from .checkpoints import describe_fit, first_mismatch, fit_architecture, read_checkpoint, unwrap_state_dict

    path = Path(spec.checkpoint).expanduser()
    architecture = _meta_architecture(spec.name, kwargs)
    check_supported(architecture, spec.name)
    weights = sum(p.numel() for p in architecture.state_dict().values()) * 4
    saved = read_checkpoint(path, CHECKPOINT_SLACK * weights + CHECKPOINT_EXTRA_BYTES,
                            needed=f"{spec.name} ({weights / (1 << 20):.0f} MiB of float32 weights)")
    state, how = unwrap_state_dict(saved, path.name, architecture.state_dict().keys())
    fitted = fit_architecture(state, architecture, kwargs)
    changed = describe_fit(kwargs, fitted)
    if changed:
        architecture = _meta_architecture(spec.name, fitted, f"Checkpoint {path.name} calls for {spec.name} with "
                                                             f"{changed}, which timm cannot build")
        check_supported(architecture, spec.name)
    model = timm.create_model(spec.name, pretrained=False, **fitted)
    try:
        filtered = _filter_checkpoint(state, model)
    except Exception:  # noqa: BLE001 - weights timm's filter cannot adapt: the sentence below names the tensor
        filtered = state
    mismatch = first_mismatch(filtered, model)
    if mismatch:
        built = f"{spec.name} ({changed})" if changed else spec.name
        raise ModelError(f"Checkpoint {path.name} does not fit {built}: {mismatch}.")
    model.load_state_dict(filtered, strict=True)
    # A checkpoint in another library's layout (no "pos_embed" key) leaves the native grid unknown.
    native = _timm_native_pos_embed(model, state["pos_embed"]) if "pos_embed" in state else None
    notes = [f"Weights read from {path.name}: {'; '.join(how)}."] if how else []
    if changed:
        notes.append(f"Built as {spec.name} with {changed}, as the checkpoint's tensor shapes say.")
    label = f"{spec.name} with weights from {path.name}" + (f" ({changed})" if changed else "")
    return _finish(model, spec, f"local file {path}", label, notes, native)


def _meta_architecture(name: str, kwargs: dict, context: str = "") -> torch.nn.Module:
    """The architecture alone, on the meta device (no memory): what its weights may take, before reading any.

    ``context``: how the sentence starts when timm cannot build it (default: the name and the arguments).
    """
    import timm

    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False, **kwargs)
    except (TypeError, AssertionError, ValueError) as exc:
        context = context or f"Model {name!r} cannot be built with {kwargs or 'its defaults'}"
        raise ModelError(f"{context}: {exc}") from exc


def _load_timm(spec: ModelSpec) -> LoadedModel:
    import timm

    if not timm.is_model(spec.name):
        raise _unknown_model_error(spec.name)
    kwargs = _img_size_kwargs(spec.img_size)
    if spec.checkpoint:
        return _load_timm_checkpoint(spec, kwargs)

    with torch.device("meta"):  # the architecture alone, no memory, to refuse unsupported families early
        architecture = timm.create_model(spec.name, pretrained=False, **kwargs)
    check_supported(architecture, spec.name)
    cfg = architecture.pretrained_cfg
    local = _local_weights(cfg)
    if local is None and not _hub_reachable():
        # Fail before building the model: offline, timm would only find out after building it.
        raise ModelError(f"Model {spec.name!r} could not be loaded: its weights are not in the local Hugging Face "
                         "cache and the hub cannot be reached (no internet, or offline mode). Use the bundled "
                         "model, or give a local checkpoint file for this architecture.")
    if local is None:
        local = _download_weights(cfg, spec.name)
    # A cached file is read directly, so a slow or absent network is never asked about it.
    overlay = {"file": str(local)} if local and not cfg.get("custom_load") else None
    try:
        model = timm.create_model(spec.name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    except (OSError, RuntimeError) as exc:
        if "No pretrained weights" in str(exc):
            reason = "timm has no pretrained weights for it"
        elif not _hub_reachable():
            reason = "its weights are not in the local Hugging Face cache and the hub cannot be reached (offline)"
        else:
            reason = f"downloading its weights failed ({type(exc).__name__})"
        raise ModelError(f"Model {spec.name!r} could not be loaded: {reason}. Use the bundled model, "
                         "or give a local checkpoint file for this architecture.") from exc
    source = f"timm pretrained weights ({cfg.get('hf_hub_id') or spec.name})"
    source += f", read from {local}" if overlay else ""
    native_model = model
    if tuple(cfg.get("input_size", (3, *model.patch_embed.img_size))[-2:]) != tuple(model.patch_embed.img_size):
        # timm keeps only the grid fitted to img_size; other grids are resampled from the stored one.
        native_model = timm.create_model(spec.name, pretrained=True, pretrained_cfg_overlay=overlay)
    pos_embed = getattr(native_model, "pos_embed", None)  # Swin has none: relative bias inside windows
    native = None if pos_embed is None else _timm_native_pos_embed(native_model, pos_embed, spec.name)
    return _finish(model, spec, source, spec.name, [], native)


def load_model(spec: ModelSpec = ModelSpec()) -> LoadedModel:
    """Build the model a spec names, on its device, in eval mode.

    Raises:
        ModelError: with a sentence naming the model, file or setting at fault.
    """
    if spec.labels is not None:
        return with_labels(load_model(replace(spec, labels=None)), spec.labels)
    if spec.head is not None:
        from ..probes.head import attach_head

        return attach_head(load_model(replace(spec, head=None)), spec.head)
    from .declared import check_weights

    check_weights(spec.name, img_size=spec.img_size)  # what the files declare, before anything is built
    kind = parse_model_name(spec.name).kind
    if kind == "bundled":
        return _load_bundled(spec)
    if kind == "transformers":
        return _load_hf(spec)
    if kind == "torchvision":
        return _load_torchvision(spec)
    return _load_timm(spec)


def _load_torchvision(spec: ModelSpec) -> LoadedModel:
    """A torchvision ViT built with ``weights=None``, then its local weights (:mod:`vitviz.sources.torchvision_models`)."""
    from . import torchvision_models

    _img_size_kwargs(spec.img_size)  # the same range as timm's
    check_supported(torchvision_models.meta_architecture(spec.name), spec.name)  # a ResNet is refused before any file
    built = torchvision_models.build(spec.name, spec.checkpoint, spec.img_size,
                                     max_bytes=lambda weights: CHECKPOINT_SLACK * weights + CHECKPOINT_EXTRA_BYTES)
    loaded = _finish(built.model, spec, built.source, built.label, built.notes, data_config=built.data_config)
    return replace(loaded, native_pos_embed=loaded.adapter.native_pos_embed(loaded.model, loaded.layout))


def with_labels(loaded: LoadedModel, labels: ClassNames) -> LoadedModel:
    """``loaded`` with class names: the same model object (names change no weight, so a cache keeps one
    model for every set of names), its spec naming them.

    Raises:
        ModelError: not one name per class.
    """
    labels.check(loaded.num_classes, loaded.label)
    return replace(loaded, spec=replace(loaded.spec, labels=labels))


def _load_hf(spec: ModelSpec) -> LoadedModel:
    """A transformers model at its image processor's resolution (see :mod:`vitviz.sources.hf`); the types it reads are
    those some adapter lists (``Adapter.hf_model_types``), and that adapter gives the layout and position table."""
    from .. import adapters
    from . import hf

    if spec.checkpoint:
        raise ModelError(f"Model {spec.name!r}: a Hugging Face model brings its weights in its folder or hub "
                         "repository; a separate checkpoint file is for timm architectures.")
    if spec.img_size is not None:
        raise ModelError(f"Model {spec.name!r}: the input resolution of a Hugging Face model is its image "
                         "processor's; leave the resolution at the model's own.")
    device = resolve_device(spec.device)
    dtype = _resolve_dtype(spec.dtype, device)
    model, family, source, text = hf.load(spec.name, device, dtype, adapters.hf_model_types())
    config, notes = hf.data_config(model, source)
    adapter = adapters.adapter_for(model)
    layout = adapter.layout(model, tuple(config["input_size"][-2:]))
    with_text = "" if text is None else " with its text tower"
    label = f"{family.label} ({type(model).__name__}){with_text} from {spec.name.removeprefix(hf.PREFIX)}"
    return LoadedModel(model=model, spec=spec, layout=layout, data_config=config,
                       weights_source=f"transformers from_pretrained({source!r})", label=label, device=device,
                       dtype=dtype, notes=notes, native_pos_embed=adapter.native_pos_embed(model, layout), text=text)

