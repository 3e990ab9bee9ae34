"""The two sides a layer comparison reads (:func:`vitviz.similarity`): a ViT's blocks at a named point through
:meth:`vitviz.Lens.trace` (:class:`LensFeatures`), a timm CNN's stages through ``forward_intermediates``
(:class:`CNNFeatures`); each image's features per layer as :data:`POOLINGS` says, and their Gram matrices per
minibatch (:func:`grams`). :func:`layer_tokens` is one image's tokens at one layer, on its grid (what the app's
comparison page clusters).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..analyses.similarity import gram
from ..errors import ModelError, VitvizError
from ..types import ModelInput

POOLINGS = {
    "tokens": "each image's patch tokens (prefix tokens dropped; a CNN's positions) flattened in grid order, so the "
              "linear kernel sums the dot products of equal positions within each model; the two models' grids "
              "need not agree, since CKA compares the n x n image Gram matrices",
    "mean": "the mean of each image's patch tokens (a CNN's: global average pooling)",
    "cls": "each image's CLS token (ViTs with a class token only)",
}
TOKEN_POINTS = ("embed", "resid_pre", "ln1", "attn_out", "resid_mid", "ln2", "mlp_hidden", "mlp_out", "resid_post")


class LensFeatures:
    """A ViT's per-layer features at one named point, read through :meth:`vitviz.Lens.trace` (never another forward).

    Args:
        lens: the opened model.
        point: a token point of every block (:data:`TOKEN_POINTS` but ``embed``): ``resid_post`` by default.
        edit: passed to :meth:`vitviz.Lens.trace` (ablations, planted changes); None: the model's own forward.
    """

    def __init__(self, lens, point: str = "resid_post", edit=None):
        if point not in TOKEN_POINTS[1:]:
            raise VitvizError(f"similarity compares token features; point {point!r} is not one of "
                              f"{', '.join(TOKEN_POINTS[1:])}.")
        self.lens, self.point, self.edit = lens, point, edit
        self.label = lens.label
        self.layer_names = tuple(f"block {i + 1}" for i in range(lens.num_layers))

    def preprocess(self, images: list) -> ModelInput:
        return self.lens.preprocess(images)

    def features(self, inputs: ModelInput, pooling: str) -> list[torch.Tensor]:
        """One (B, F) tensor per block."""
        trace = self.lens.trace(inputs, keep=self.point, edit=self.edit)
        layout = trace.layout
        if pooling == "cls" and not layout.has_class_token:
            raise VitvizError(f"{self.label} has no CLS token: compare it with pooling 'mean' or 'tokens'.")
        out = []
        for value in trace.each(self.point):
            if value.ndim == 4:  # window families: tokens on the stage's grid (B, gh, gw, D), no prefix
                out.append(pool(value.flatten(1, 2), 0, pooling))
            else:
                out.append(pool(value, layout.num_prefix_tokens, pooling, layout.cls_index))
        return out


class CNNFeatures:
    """A timm CNN's stage outputs (ResNet, ConvNeXt, ...) as the other side of a comparison.

    Args:
        model: a timm model with ``forward_intermediates`` (:func:`vitviz.adapters.cnn.is_cnn`), in eval mode.
        data_config: its timm data config (resize, crop, mean, std); default resolved from the model.
        label: the model in words; default its class name.
    """

    def __init__(self, model: torch.nn.Module, data_config: dict | None = None, label: str | None = None):
        from timm.data import resolve_model_data_config

        from ..adapters.cnn import is_cnn, stage_names

        if not is_cnn(model):
            raise ModelError(f"{type(model).__name__} is not a CNN whose stages vitviz reads (timm's "
                             "forward_intermediates over feature_info).")
        self.model = model.eval().requires_grad_(False)
        self.data_config = data_config or resolve_model_data_config(model)
        self.label = label or type(model).__name__
        self.layer_names = tuple(stage_names(model))

    @classmethod
    def open(cls, name: str, checkpoint: str | Path | None = None, device: str = "auto") -> "CNNFeatures":
        """A timm CNN by name, with local weights (``checkpoint``) or its pretrained weights if they are on disk.

        Raises:
            ModelError: an unknown name, a model that is not a CNN, weights that cannot be read or are not here.
        """
        import timm

        from ..sources.checkpoints import first_mismatch, read_checkpoint, unwrap_state_dict
        from ..sources.models import _local_weights, resolve_device

        if not timm.is_model(name):
            raise ModelError(f"Unknown model {name!r}: timm has no model of that name.")
        if checkpoint is None:
            with torch.device("meta"):
                cfg = timm.create_model(name, pretrained=False).pretrained_cfg
            local = _local_weights(cfg)
            if local is None:
                raise ModelError(f"Model {name!r}: its pretrained weights are not on this machine; give --checkpoint "
                                 "with local weights for this architecture.")
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(local)})
            source = f"timm pretrained weights, read from {local}"
        else:
            path = Path(checkpoint).expanduser()
            model = timm.create_model(name, pretrained=False)
            weights = sum(t.numel() for t in model.state_dict().values()) * 4
            state, _ = unwrap_state_dict(read_checkpoint(path, 4 * weights + (64 << 20)), path.name,
                                         model.state_dict().keys())
            mismatch = first_mismatch(state, model)
            if mismatch:
                raise ModelError(f"Checkpoint {path.name} does not fit {name}: {mismatch}.")
            model.load_state_dict(state, strict=True)
            source = f"weights from {path.name}"
        return cls(model.to(resolve_device(device)), label=f"{name} ({source})")

    def preprocess(self, images: list) -> ModelInput:
        from ..sources.preprocess import preprocess

        return preprocess(images, self.data_config)

    def features(self, inputs: ModelInput, pooling: str) -> list[torch.Tensor]:
        """One (B, F) tensor per stage."""
        from ..adapters.cnn import cnn_stages

        if pooling == "cls":
            raise VitvizError(f"{self.label} is a CNN and has no CLS token: compare it with pooling 'mean' or "
                              "'tokens'.")
        param = next(self.model.parameters())
        with torch.inference_mode():
            stages = cnn_stages(self.model, inputs.tensor.to(device=param.device, dtype=param.dtype))
        return [pool(s.flatten(2).transpose(1, 2), 0, pooling) for s in stages]


def pool(tokens: torch.Tensor, prefix: int, pooling: str, cls_index: int | None = None) -> torch.Tensor:
    """(B, N, D) tokens with ``prefix`` leading prefix tokens -> (B, F) features of each image (:data:`POOLINGS`)."""
    if pooling == "cls":
        return tokens[:, cls_index]
    patches = tokens[:, prefix:]
    return patches.mean(1) if pooling == "mean" else patches.flatten(1)


def is_cnn_name(name: str) -> bool:
    """Whether ``name`` is a timm CNN whose stages :class:`CNNFeatures` reads (built on the meta device: no memory)."""
    import timm

    from ..adapters.cnn import is_cnn
    from ..sources.names import parse_model_name

    if parse_model_name(name).kind != "timm" or not timm.is_model(name):
        return False
    with torch.device("meta"):
        return is_cnn(timm.create_model(name, pretrained=False))


def open_features(spec):
    """A :class:`vitviz.sources.models.ModelSpec` opened for a comparison: a timm CNN as :class:`CNNFeatures`, any
    other model as :func:`vitviz.open` opens it.

    Raises:
        ModelError: the model cannot be loaded (the sentence says why).
    """
    from ..lens import Lens
    from ..sources.models import load_model

    if is_cnn_name(spec.name):
        return CNNFeatures.open(spec.name, spec.checkpoint, device=spec.device)
    return Lens(load_model(spec))


def features_of(side, point: str):
    """A Lens as :class:`LensFeatures` at ``point``; a :class:`LensFeatures` or :class:`CNNFeatures` as it is."""
    from ..lens import Lens

    if isinstance(side, Lens):
        return LensFeatures(side, point)
    if isinstance(side, (LensFeatures, CNNFeatures)):
        return side
    raise TypeError(f"similarity compares a vitviz.Lens or a CNNFeatures, not a {type(side).__name__}")


@dataclass(frozen=True)
class LayerTokens:
    """One image's tokens at one layer of one side of a comparison, on that layer's grid (what the page clusters).

    Attributes:
        features: (gh * gw, D) float32, positions in raster order, prefix tokens dropped.
        layout: the grid and the model-input pixels one position covers (a CNN stage's: its stride); no prefix.
        image: the side's own model-input image (its resize and crop), on which the grid lies.
    """

    features: np.ndarray
    layout: object
    image: object


def layer_tokens(side, image, layer: int) -> LayerTokens:
    """The tokens of one image at layer ``layer`` (0-based) of ``side`` (:class:`LensFeatures` at its point, or
    :class:`CNNFeatures`' stage).

    Args:
        side: a :class:`LensFeatures` or :class:`CNNFeatures` (a :class:`vitviz.Lens` is read at ``resid_post``).
        image: a path, PIL image or (H, W, 3) array.
        layer: 0-based, as in :attr:`vitviz.runs.similarity_run.Similarity.layers_a`.
    """
    from ..adapters.cnn import cnn_stages
    from ..layout import TokenLayout

    from ..lens import _as_rgb

    side = features_of(side, "resid_post")
    inputs = side.preprocess([_as_rgb(image, 0).image])
    if isinstance(side, CNNFeatures):
        param = next(side.model.parameters())
        with torch.inference_mode():
            stage = cnn_stages(side.model, inputs.tensor.to(device=param.device, dtype=param.dtype))[layer]
        grid = tuple(stage.shape[-2:])
        tokens = stage[0].flatten(1).T
    else:
        trace = side.lens.trace(inputs, keep=side.point, edit=side.edit)
        value = trace.each(side.point)[layer][0]
        if value.ndim == 3:  # window families: (gh, gw, D) on the stage's grid, no prefix
            grid, tokens = tuple(value.shape[:2]), value.flatten(0, 1)
        else:
            grid, tokens = trace.layout.grid_size, value[trace.layout.num_prefix_tokens:]
    height, width = inputs.tensor.shape[-2:]
    layout = TokenLayout(prefix_tokens=(), grid_size=grid, patch_size=(height // grid[0], width // grid[1]),
                         global_pool="", pos_embed_prefix_rows=0)
    return LayerTokens(features=tokens.float().cpu().numpy(), layout=layout, image=inputs.images[0])


def grams(side, pictures: list, pooling: str, kernel: str, threshold: float) -> torch.Tensor:
    """(L, n, n) float64 Gram matrices of one side's layers for one minibatch."""
    features = side.features(side.preprocess(pictures), pooling)
    # float64 on the model's device (CUDA has it), on the host for MPS (which has no float64)
    return torch.stack([gram(f.float().cpu() if f.device.type == "mps" else f.float(), kernel, threshold)
                        for f in features])
