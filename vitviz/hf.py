"""Hugging Face ``transformers`` vision transformers: load, preprocess and read their attention.

The one place that knows how to run a transformers ViT family. It yields what
:mod:`vitviz.capture` yields for timm models — a :class:`~vitviz.capture.Capture` with the
attention of every layer and a :class:`~vitviz.layout.TokenLayout` — so the analyses, pages and
CLI stay family-blind.

transformers computes attention with SDPA by default and then returns *no* probabilities for
``output_attentions=True`` (an empty tuple, no error). The loader therefore builds every model
with ``attn_implementation="eager"`` once; nothing is switched per request, so one model is
shared by every session and thread. The probabilities are exactly those the eager forward
multiplies the values with.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from PIL import Image

from .errors import ModelError, first_line
from .layout import TokenLayout
from .sources import HF_PREFIX, parse_model_name

PREFIX = HF_PREFIX
LIBRARY = "transformers"


@dataclass(frozen=True)
class AttentionParts:
    """The modules one layer's attention is computed with.

    Attributes:
        norm: the layer norm the block's input goes through before attention.
        attention: the attention module (``q_proj``, ``k_proj``, ``v_proj``, ``head_dim``).
        output: its output projection (its input is the heads' context, concatenated).
        scale: the factor the scores q·k are multiplied by.
        steps: the layer's extra steps in words, as :class:`vitviz.anatomy.LayerQKV` states them.
    """

    norm: torch.nn.Module
    attention: torch.nn.Module
    output: torch.nn.Module
    scale: float
    steps: tuple[str, ...]


def _parts(layer, norm: str, attention: str, output: str, scale: str) -> AttentionParts:
    attn = getattr(layer, attention)
    norm_module = getattr(layer, norm)
    return AttentionParts(norm=norm_module, attention=attn, output=getattr(attn, output),
                          scale=float(getattr(attn, scale)),
                          steps=(f"the block's input goes through {norm} ({type(norm_module).__name__})",))


# One function per layout of modules: (model, 0-based layer) -> AttentionParts.
def _vit_parts(model, layer: int) -> AttentionParts:  # ViT, DeiT: base.layers[l].layernorm_before, .attention
    return _parts(model.base_model.layers[layer], "layernorm_before", "attention", "o_proj", "scaling")


def _dinov2_parts(model, layer: int) -> AttentionParts:  # DINOv2 (+ registers): base.encoder.layer[l].norm1
    return _parts(model.base_model.encoder.layer[layer], "norm1", "attention", "o_proj", "scaling")


def _clip_parts(model, layer: int) -> AttentionParts:  # CLIP, SigLIP: base.encoder.layers[l].layer_norm1, .self_attn
    return _parts(model.base_model.encoder.layers[layer], "layer_norm1", "self_attn", "out_proj", "scale")


# One function per family with a position term outside q·k: (model, 0-based layer, pixels x) -> (1, H, N, N).
def _beit_bias(model, layer: int, x: torch.Tensor) -> torch.Tensor | None:
    """BEiT's relative position bias of one layer for the input ``x``, as ``BeitModel.forward`` and
    ``BeitLayer.forward`` add it to the scaled scores: the layer's own plus the model's shared one."""
    base, patch = model.base_model, model.config.patch_size
    window = (x.shape[-2] // patch, x.shape[-1] // patch)
    n, interpolate = window[0] * window[1] + 1, _interpolates(model, x)
    shared = (base.shared_position_bias(window, interpolate_pos_encoding=interpolate, dim_size=n)
              if base.shared_position_bias is not None else None)
    own = base.layers[layer].relative_position_bias
    if own is None:
        return shared
    bias = own(window, interpolate, dim_size=n)
    return bias if shared is None else bias + shared


# One function per family: (base model output) -> (B, D) the pooled vector a headless model is scored by.
def _cls_token(out) -> torch.Tensor:
    """ViT, DeiT, DINOv2: the CLS token after the final layernorm (what their classifiers read; DINOv2's
    ``pooler_output``; timm's ``pre_logits`` for ``global_pool='token'``)."""
    return out.last_hidden_state[:, 0]


def _pooler_output(out) -> torch.Tensor:
    """CLIP: ``pooler_output`` (the CLS token after ``post_layernorm``), the vector the projection reads.
    SigLIP: ``pooler_output`` (its attention-pooling head); without the head, the mean token after
    ``post_layernorm``."""
    return out.pooler_output if out.pooler_output is not None else out.last_hidden_state.mean(dim=1)


_CLS_TEXT = "the CLS token after the final layernorm"
_POOLER_TEXT = "pooler_output"


@dataclass(frozen=True)
class Family:
    """How one transformers ``model_type`` is loaded and taken apart.

    Args:
        label: what a reader of the papers calls it.
        base: the vision model class without a head (loads a full CLIP/SigLIP folder's vision tower too).
        heads: classifier classes accepted from ``config.architectures``.
        parts: (model, layer) -> :class:`AttentionParts` of that layer.
        pool: base model output -> (B, D) pooled vector (headless models' faithfulness score).
        pool_text: that vector in words.
        pos_antialias: whether the family's ``interpolate_pos_encoding`` resamples the position
            embedding with antialiasing (bicubic, ``align_corners=False`` for every family).
        bias: (model, layer, pixels) -> (1, H, N, N) added to the scaled scores, or None; None: no such term.
        bias_text: that term in words (the anatomy's steps).
    """

    label: str
    base: str
    heads: tuple[str, ...] = ()
    parts: Callable = _vit_parts
    pool: Callable = _cls_token
    pool_text: str = _CLS_TEXT
    pos_antialias: bool = False
    bias: Callable | None = None
    bias_text: str = ""


_CLIP = dict(parts=_clip_parts, pool=_pooler_output, pool_text=_POOLER_TEXT + " (the CLS token after post_layernorm)")
_SIGLIP = dict(parts=_clip_parts, pool=_pooler_output,
               pool_text=_POOLER_TEXT + " (the attention-pooling head; the mean token without it)")
FAMILIES = {
    "vit": Family("ViT", "ViTModel", ("ViTForImageClassification",)),
    "deit": Family("DeiT", "DeiTModel", ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")),
    "dinov2": Family("DINOv2", "Dinov2Model", ("Dinov2ForImageClassification",), parts=_dinov2_parts),
    "dinov2_with_registers": Family("DINOv2 with registers", "Dinov2WithRegistersModel",
                                    ("Dinov2WithRegistersForImageClassification",), parts=_dinov2_parts,
                                    pos_antialias=True),
    "clip": Family("CLIP vision tower", "CLIPVisionModel", **_CLIP),
    "clip_vision_model": Family("CLIP vision tower", "CLIPVisionModel", **_CLIP),
    "siglip": Family("SigLIP vision tower", "SiglipVisionModel", **_SIGLIP),
    "siglip_vision_model": Family("SigLIP vision tower", "SiglipVisionModel", **_SIGLIP),
    "beit": Family("BEiT", "BeitModel", ("BeitForImageClassification",), pool=_pooler_output,
                   pool_text=_POOLER_TEXT + " (the mean patch token after layernorm with mean pooling, else the CLS "
                   "token)", bias=_beit_bias,
                   bias_text="a learned relative position bias (one value per head and pair of positions) is added "
                             "to the scaled scores before the softmax"),
}


def family_of(model) -> Family:
    """The family of a model built by :func:`load`."""
    return FAMILIES[model.config.model_type]
# Families whose forward resamples the position embedding itself (no interpolate_pos_encoding argument).
_ALWAYS_INTERPOLATE = {"dinov2", "dinov2_with_registers"}


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

        from .hub import _hub_reachable

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


def _family(config, name: str, more: dict | None = None) -> Family:
    """The family of a config: one of :data:`FAMILIES` or of ``more`` (model_type -> HFModelType, the types
    other adapters read; see ``vitviz.adapters.hf_model_types``)."""
    model_type = getattr(config, "model_type", "")
    known = {**{t: f.label for t, f in FAMILIES.items()}, **{t: m.label for t, m in (more or {}).items()}}
    if model_type not in known:
        raise ModelError(f"Model {name!r} is not supported yet: its config is a {model_type or 'unknown'!r} "
                         f"({', '.join(config.architectures or []) or type(config).__name__}) model. vitviz reads "
                         f"attention from transformers {', '.join(sorted(set(known.values())))} models.")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    spec = more[model_type]
    return Family(spec.label, spec.base, tuple(spec.heads))


def load(name: str, device: torch.device, dtype: torch.dtype, more: dict | None = None):
    """Build a transformers vision model with eager attention, in eval mode, on ``device``.

    ``more``: model_type -> HFModelType for the types adapters read beyond :data:`FAMILIES`.

    Returns:
        (model, family, source): ``source`` is the folder or hub id the weights came from.

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
    family = _family(config, name, more)
    arch = next((a for a in (config.architectures or []) if a in family.heads), family.base)
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
    return model, family, source


def num_classes(model) -> int:
    """Classes of the model's classifier head; 0 without one."""
    return len(model.config.id2label) if type(model).__name__ in _HEAD_CLASSES else 0


_HEAD_CLASSES = {h for f in FAMILIES.values() for h in f.heads}


def class_labels(model) -> tuple[str, ...] | None:
    """``config.id2label`` in class order, or None without a head."""
    n = num_classes(model)
    return tuple(str(model.config.id2label[i]) for i in range(n)) if n else None


def card(model, family: Family, source: str) -> dict:
    """Facts about the model for a model card or settings.json."""
    config = vision_config(model.config)
    return {
        "library": LIBRARY,
        "family": family.label,
        "architecture": type(model).__name__,
        "model_type": model.config.model_type,
        "attn_implementation": model.config._attn_implementation,
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "embed_dim": int(config.hidden_size),
        "source": source,
    }


def patch_filter_weight(model) -> torch.Tensor:
    """The linear patch-embedding filters (D, 3, P, P): the convolution with kernel = stride = patch size."""
    config = vision_config(model.config)
    patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d) and module.in_channels == 3 and \
                module.kernel_size[0] == module.stride[0] == patch:
            return module.weight
    raise ValueError(f"{type(model).__name__} has no linear RGB patch filters.")


def position_embedding(model) -> torch.Tensor:
    """The learned position embedding as stored: (1, prefix rows + gh * gw, D).

    ViT, DeiT and DINOv2 keep a parameter ``position_embeddings``; CLIP and SigLIP an
    ``nn.Embedding`` ``position_embedding``, one row per position.
    """
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, torch.Tensor) and table.ndim == 3:
            return table
        table = getattr(module, "position_embedding", None)
        if isinstance(table, torch.nn.Embedding):
            return table.weight[None]
    raise ValueError(f"{type(model).__name__} has no learned absolute position embedding.")


def position_encoding(model) -> str:
    """How the model encodes position, in words (model card, the position-embedding page)."""
    config = vision_config(model.config)
    try:
        absolute = position_embedding(model) is not None
    except ValueError:
        absolute = False
    kinds = [k for k, on in (("learned absolute position embedding", absolute),
                             ("relative position bias per layer", getattr(config, "use_relative_position_bias", False)),
                             ("shared relative position bias",
                              getattr(config, "use_shared_relative_position_bias", False))) if on]
    return " + ".join(kinds) or "none"


def native_pos_embed(model, layout: TokenLayout):
    """The stored grid (the config's ``image_size``); other grids are resampled as the family's own
    ``interpolate_pos_encoding`` does: bicubic to the exact grid, antialiased only for DINOv2 with registers.
    None for a model without one (BEiT with only relative position biases)."""
    from .types import NativePosEmbed

    try:
        table = position_embedding(model)
    except ValueError:
        return None
    return NativePosEmbed.from_weights(table, layout.pos_embed_prefix_rows, antialias=family_of(model).pos_antialias)


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

    The timm keys let :func:`vitviz.images.model_view` say which part of an upload the model sees;
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
    from .types import ModelInput

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


# ---------------------------------------------------------------------------------------------
# Attention


def token_layout(model, input_hw: tuple[int, int] | None = None) -> TokenLayout:
    return TokenLayout.from_hf_config(model.config, input_hw)


def _interpolates(model, x: torch.Tensor) -> bool:
    """Whether the forward is asked to fit its position terms to ``x``'s size (not the config's)."""
    config = vision_config(model.config)
    side = config.image_size if not isinstance(config.image_size, int) else (config.image_size, config.image_size)
    return tuple(x.shape[-2:]) != tuple(side) and model.config.model_type not in _ALWAYS_INTERPOLATE


def _forward(model, x: torch.Tensor, attentions: bool = True, hidden_states: bool = True):
    kwargs = {"interpolate_pos_encoding": True} if _interpolates(model, x) else {}
    return model(pixel_values=x, output_attentions=attentions, output_hidden_states=hidden_states, **kwargs)


def _final_features(model, out) -> torch.Tensor:
    """The last layer's tokens as the model's own output gives them (after its final norm).

    Classifier outputs carry no ``last_hidden_state``; their base model's final ``layernorm`` is
    applied to the last hidden state, as the classifier's own forward does before its head.
    """
    if getattr(out, "last_hidden_state", None) is not None:
        return out.last_hidden_state
    return model.base_model.layernorm(out.hidden_states[-1])


def iter_layers(model, x: torch.Tensor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yields (layer index, tokens after it (B, N, D), attention (B, H, N, N)), as
    :func:`vitviz.capture.iter_layers` does for timm (one forward; the layers are read from it)."""
    out = _forward(model, x)
    for i, probs in enumerate(out.attentions):
        yield i, out.hidden_states[i + 1], probs


def capture(model, images: torch.Tensor):
    """:func:`vitviz.capture.capture` for a transformers model: the same :class:`~vitviz.capture.Capture`.

    ``features`` are the model's own final tokens (:func:`_final_features`; CLIP's
    ``last_hidden_state`` comes before its ``post_layernorm``, as transformers returns it).
    """
    from .types import Capture, to_model_input

    x = to_model_input(model, images)
    out = _forward(model, x)
    B, L = x.shape[0], len(out.attentions)
    layout = token_layout(model, tuple(x.shape[-2:]))
    attention = torch.empty(B, L, *out.attentions[0].shape[1:], dtype=torch.float32, device=x.device)
    norms = torch.empty(B, L, layout.num_tokens, dtype=torch.float32, device=x.device)
    for i, probs in enumerate(out.attentions):
        attention[:, i] = probs
        norms[:, i] = out.hidden_states[i + 1].float().norm(dim=-1)
    logits = out.logits if num_classes(model) else None
    return Capture(attention=attention, features=_final_features(model, out).float().cpu(),
                   logits=None if logits is None else logits.float().cpu(), token_norms=norms, layout=layout)


def attention_and_logits(model, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """See :func:`vitviz.capture.attention_and_logits`."""
    out = _forward(model, x)
    return list(out.attentions), out.logits


# ---------------------------------------------------------------------------------------------
# Explanations: a layer's q, k, v (attention anatomy, key clusters) and the scored outputs (faithfulness)


def block_input(model, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The tokens entering layer ``layer`` (0-based): ``hidden_states[layer]`` of the model's own forward
    (layer 0: the embeddings, after CLIP's ``pre_layrnorm``): (B, 3, H, W) -> (B, N, D)."""
    return _forward(model, x, attentions=False).hidden_states[layer]


def block_output(model, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The tokens leaving layer ``layer`` (0-based; before the final norm): (B, N, D)."""
    return _forward(model, x, attentions=False).hidden_states[layer + 1]


def attention_parts(model, layer: int) -> AttentionParts:
    """The modules of layer ``layer`` (0-based) that compute its attention."""
    return family_of(model).parts(model, layer)


def layer_qkv(model, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float,
                                                            tuple[str, ...], torch.Tensor | None]:
    """q, k, v (each (B, H, N, d_head)) of layer ``layer`` from its attention module's own projections of
    its normed input, with the scale, the layer's steps in words and the bias added to the scaled scores
    ((1, H, N, N) or None); softmax(q kᵀ · scale + bias) is the attention the eager forward returns and
    (its weights) @ v the context its output projection reads."""
    parts, family = attention_parts(model, layer), family_of(model)
    bias = family.bias(model, layer, x) if family.bias is not None else None
    steps = parts.steps + ((family.bias_text,) if bias is not None else ())
    h = parts.norm(block_input(model, x, layer))
    B, N, _ = h.shape
    attn = parts.attention

    def heads(proj) -> torch.Tensor:
        return proj(h).view(B, N, -1, attn.head_dim).transpose(1, 2)

    return heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj), parts.scale, steps, bias


def logits(model, x: torch.Tensor) -> torch.Tensor:
    """The classifier's logits (B, C) of the model's own forward (DeiT with teacher: the mean of its two heads)."""
    return _forward(model, x, attentions=False, hidden_states=False).logits


def pre_logits(model, x: torch.Tensor) -> torch.Tensor:
    """The pooled vector of the family (:attr:`Family.pool_text`) from the base model's own forward: (B, D)."""
    return family_of(model).pool(_forward(model.base_model, x, attentions=False, hidden_states=False))


def pre_logits_text(model) -> str:
    """What :func:`pre_logits` returns for this model, in words."""
    return family_of(model).pool_text
