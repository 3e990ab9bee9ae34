"""How the layers of one model relate to each other and to another model's: :func:`similarity`, CKA over an image set.

```python
import vitviz
a = vitviz.open("bundled")
result = vitviz.similarity(a, a, ["assets/"], batch_size=8)      # within one model: (12, 12)
cnn = vitviz.CNNFeatures.open("resnet50", checkpoint="resnet50.safetensors")   # a CNN's stages as the other side
result = vitviz.similarity(a, cnn, paths, pooling="mean")         # (12, 5)
result.cka, result.low, result.high                               # (L_a, L_b), 0-based layers
result.table()                                                    # layer_a, layer_b, cka, low, high, images
```

A ViT's layers are read through :meth:`vitviz.Lens.trace` at a named point (``resid_post`` by default); a CNN's
stages through timm's ``forward_intermediates`` (:mod:`vitviz.adapters.cnn`). Images are the examples; each layer's
features per image are chosen by ``pooling`` (:data:`POOLINGS`). The estimator and its interval are
:class:`vitviz.analyses.similarity.MinibatchCKA`'s.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ..analyses.similarity import KERNELS, MinibatchCKA, gram, minibatch_sums
from ..errors import ImageError, ModelError, VitvizError
from ..types import ModelInput

POOLINGS = {
    "tokens": "each image's patch tokens (prefix tokens dropped; a CNN's positions) flattened in grid order, so the "
              "linear kernel sums the dot products of equal positions within each model; the two models' grids "
              "need not agree, since CKA compares the n x n image Gram matrices",
    "mean": "the mean of each image's patch tokens (a CNN's: global average pooling)",
    "cls": "each image's CLS token (ViTs with a class token only)",
}
TOKEN_POINTS = ("embed", "resid_pre", "ln1", "attn_out", "resid_mid", "ln2", "mlp_hidden", "mlp_out", "resid_post")
MIN_BATCH = 4  # the unbiased HSIC needs four examples


class TooFewImages(VitvizError):
    """Fewer than four of the images could be read; ``skipped``: (name, reason) of each that could not."""

    def __init__(self, message: str, skipped: list[tuple[str, str]]):
        super().__init__(message)
        self.skipped = skipped


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
class Similarity:
    """CKA of every layer of model A against every layer of model B over one image set.

    Attributes:
        cka: (L_a, L_b) float64, layer i of A (0-based, row) against layer j of B (column); 1-based on screen.
        low: (L_a, L_b) the bootstrap interval's 2.5 percentile over images; NaN with bootstrap=0.
        high: (L_a, L_b) its 97.5 percentile.
        images: how many images the estimate used.
        layers_a: model A's layer names (``"block 1"``, ... ; a CNN's stage modules ``"layer1"``, ...).
        layers_b: model B's.
        settings: models, point, pooling (with what it means), kernel, batch size, minibatches, estimator, interval.
    """

    cka: np.ndarray
    low: np.ndarray
    high: np.ndarray
    images: int
    layers_a: tuple[str, ...]
    layers_b: tuple[str, ...]
    settings: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """One row per pair of layers: layer_a, layer_b (0-based), cka, low, high, images."""
        la, lb = self.cka.shape
        a, b = np.meshgrid(np.arange(la), np.arange(lb), indexing="ij")
        return pd.DataFrame({"layer_a": a.ravel(), "layer_b": b.ravel(), "cka": self.cka.ravel(),
                             "low": self.low.ravel(), "high": self.high.ravel(), "images": self.images})

    def diagonal(self) -> pd.DataFrame:
        """The curve along the map: for two models, each layer of A against B's layer at the same relative depth (the
        same index when the depths agree); within one model, each layer against the next (how much each block
        changes the representation). Columns layer_a, layer_b (0-based), cka, low, high."""
        la, lb = self.cka.shape
        if self.settings.get("same_model"):
            a = np.arange(la - 1)
            b = a + 1
        else:
            a = np.arange(la)
            b = np.clip(np.round((a + 1) * lb / la).astype(int) - 1, 0, lb - 1)
        return pd.DataFrame({"layer_a": a, "layer_b": b, "cka": self.cka[a, b], "low": self.low[a, b],
                             "high": self.high[a, b]})


def _check_options(pooling: str, kernel: str, batch_size: int, images: int) -> None:
    """A sentence for a pooling or kernel :func:`similarity` does not know, or too few images per minibatch or all."""
    if pooling not in POOLINGS:
        raise VitvizError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}.")
    if kernel not in KERNELS:
        raise VitvizError(f"kernel {kernel!r} is not one of {', '.join(KERNELS)}.")
    if batch_size < MIN_BATCH:
        raise VitvizError(f"batch size {batch_size}: minibatch CKA needs {MIN_BATCH} or more images per minibatch.")
    if images < MIN_BATCH:
        raise VitvizError(f"{images} image(s): CKA needs {MIN_BATCH} or more (the unbiased HSIC compares "
                          "pairs of pairs of images).")


def similarity(lens_a, lens_b, images: Sequence, point: str = "resid_post", pooling: str = "tokens",
               batch_size: int = 32, kernel: str = "linear", threshold: float = 1.0, bootstrap: int = 200,
               seed: int = 0, progress: Callable[[int, int], None] | None = None) -> Similarity:
    """CKA between every layer of ``lens_a`` and every layer of ``lens_b`` on the same images.

    Minibatch CKA with the unbiased HSIC (Nguyen, Raghu & Kornblith, ICLR 2021): images go through both models
    ``batch_size`` at a time and only the sums of each minibatch's HSIC stay, so memory does not grow with the number
    of images; the interval is a Bayesian bootstrap over the images (:class:`vitviz.analyses.similarity.MinibatchCKA`).

    Args:
        lens_a: a :class:`vitviz.Lens` (read at ``point``), a :class:`LensFeatures` or a :class:`CNNFeatures`.
        lens_b: the same kinds; ``lens_a`` itself gives the within-model map from one forward per batch.
        images: paths, PIL images or (H, W, 3) arrays (anything :meth:`vitviz.Lens.preprocess` takes); 4 or more.
        point: a ViT's token point per block (``resid_post``: each block's output).
        pooling: ``"tokens"``, ``"mean"`` or ``"cls"``: what one image's features are (:data:`POOLINGS`).
        batch_size: images per minibatch (4 or more; the images are split into near-equal minibatches).
        kernel: ``"linear"`` or ``"rbf"`` (width ``threshold`` x the median distance in each minibatch).
        bootstrap: replicates of the interval (0: none).
        seed: of the bootstrap.
        progress: ``progress(done, total)`` after each minibatch, in images.

    Returns:
        Similarity: ``cka``, ``low``, ``high`` (L_a, L_b); ``images``; ``settings``.

    Raises:
        VitvizError: fewer than 4 images, an unknown pooling, kernel or point, CLS pooling of a model without one.
    """
    images = list(images)
    _check_options(pooling, kernel, batch_size, len(images))
    side_a = features_of(lens_a, point)
    same = lens_b is lens_a
    side_b = side_a if same else features_of(lens_b, point)
    sizes = iter(minibatch_sizes(len(images), batch_size))
    accumulator = MinibatchCKA(len(side_a.layer_names), len(side_b.layer_names), replicates=bootstrap, seed=seed)
    from ..lens import _as_rgb

    def add(loaded: list) -> None:
        pictures = [item.image for item in loaded]
        grams_a = _grams(side_a, pictures, pooling, kernel, threshold)
        grams_b = grams_a if same else _grams(side_b, pictures, pooling, kernel, threshold)
        accumulator.update(grams_a, grams_b, same=same)

    # Images are decoded once for both models, a minibatch at a time. One that cannot be read is skipped and the next
    # images fill its minibatch; each full minibatch waits until the next is full, so that a last one left short by
    # unreadable files joins it instead of being dropped.
    pending, held, skipped, target = [], [], [], next(sizes)
    for i, item in enumerate(images):
        try:
            pending.append(_as_rgb(item, i))
        except ImageError as exc:
            skipped.append((exc.name, exc.reason))
        if len(pending) >= target:
            if held:
                add(held)
                if progress is not None:
                    progress(i + 1 - len(pending), len(images))
            held, pending, target = pending, [], next(sizes, target)
    if len(pending) >= MIN_BATCH:
        if held:
            add(held)
        held = pending
    else:
        held += pending
    if len(held) >= MIN_BATCH:
        add(held)
    else:
        skipped += [(item.name, f"fewer than {MIN_BATCH} readable images in all") for item in held]
    if progress is not None:
        progress(len(images), len(images))
    if accumulator.batches == 0:
        raise TooFewImages(f"fewer than {MIN_BATCH} of the {len(images)} images could be read: CKA needs {MIN_BATCH}.",
                           skipped)
    return result_of(accumulator, describe(side_a, side_b), point=point, pooling=pooling, kernel=kernel,
                     threshold=threshold, batch_size=batch_size, seed=seed, skipped=skipped)


def describe(side_a, side_b) -> dict:
    """The two sides in words: labels, layer names, whether they are one model."""
    return {"model_a": side_a.label, "model_b": side_b.label, "same_model": side_b is side_a,
            "layers_a": list(side_a.layer_names), "layers_b": list(side_b.layer_names)}


def result_of(accumulator: MinibatchCKA, sides: dict, *, point: str, pooling: str, kernel: str, threshold: float,
              batch_size: int, seed: int, skipped: list[tuple[str, str]]) -> Similarity:
    """The summed minibatches as a :class:`Similarity`, with its settings in words (``sides``: :func:`describe`)."""
    cka, low, high = accumulator.result()
    bootstrap = accumulator.replicates
    settings = {
        "model_a": sides["model_a"], "model_b": sides["model_b"], "same_model": sides["same_model"],
        "point": point, "pooling": pooling, "pooling_means": POOLINGS[pooling],
        "kernel": kernel, "rbf_threshold": threshold if kernel == "rbf" else None,
        "batch_size": batch_size, "minibatches": accumulator.batches, "images": accumulator.images,
        "estimator": "minibatch CKA with the unbiased HSIC (Song et al. 2012) summed over minibatches "
                     "(Nguyen, Raghu & Kornblith, ICLR 2021); examples are images",
        "interval": f"95 % percentile Bayesian bootstrap over the {accumulator.images} images ({bootstrap} replicates "
                    f"of Exp(1) image weights, seed {seed}; each minibatch's unbiased HSIC weighted)" if bootstrap
                    else "none (bootstrap 0)",
        "layers": "0-based in arrays and tables; 1-based on screen",
        "skipped": skipped,
    }
    return Similarity(cka=cka, low=low, high=high, images=accumulator.images, layers_a=tuple(sides["layers_a"]),
                      layers_b=tuple(sides["layers_b"]), settings=settings)


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
        layer: 0-based, as in :attr:`Similarity.layers_a`.
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


def minibatch_sizes(images: int, batch_size: int) -> list[int]:
    """How ``images`` images split into minibatches: near-equal ones of at most ``batch_size`` images, unless that
    would leave one under four (then fewer, larger ones); one minibatch when there are under eight images."""
    count = max(1, min(-(-images // batch_size), images // MIN_BATCH))
    return [len(b) for b in np.array_split(np.arange(images), count)]


# ---- the command's runner: minibatches on the engine, each one durable --------------------------------------

@dataclass(frozen=True)
class SidesSpec:
    """What a worker opens: model A, model B (None: A's within-model map), the point read.

    Attributes:
        a: model A's :class:`vitviz.sources.models.ModelSpec`.
        b: model B's, or None.
        point: a ViT's token point per block.
    """

    a: object
    b: object | None
    point: str

    def open(self) -> "Sides":
        side_a = features_of(open_features(self.a), self.point)
        side_b = side_a if self.b is None else features_of(open_features(self.b), self.point)
        return Sides(side_a, side_b, self)


@dataclass(frozen=True)
class Sides:
    """Both sides of a comparison, loaded (the runner :func:`vitviz.runs.engines.run_batches` hands to
    :class:`CKAWork`; it has no ``loaded``, so the engine gives it decoded images and each side preprocesses its own).

    Attributes:
        a: :class:`LensFeatures` or :class:`CNNFeatures`.
        b: the same kinds; ``a`` itself for the within-model map.
        spec: how a Ray actor opens the same.
    """

    a: object
    b: object
    spec: SidesSpec

    @property
    def same(self) -> bool:
        return self.b is self.a


@dataclass(frozen=True)
class CKAWork:
    """The per-batch function of the ``similarity`` command: both sides' Gram matrices of one minibatch (the
    forwards, :meth:`__call__`), then that minibatch's terms of the sums (:meth:`finish`, with its bootstrap
    replicates): exactly what :func:`similarity` adds for the same minibatch. None for a minibatch with fewer than
    four readable images. The value carries the sides in words (:func:`describe`): a driver on Ray loads no
    model."""

    pooling: str
    kernel: str
    threshold: float
    replicates: int
    seed: int

    def __call__(self, sides: Sides, batch):
        if len(batch.x) < MIN_BATCH:
            return None
        grams_a = _grams(sides.a, batch.x, self.pooling, self.kernel, self.threshold)
        grams_b = grams_a if sides.same else _grams(sides.b, batch.x, self.pooling, self.kernel, self.threshold)
        return batch.index, grams_a, grams_b, describe(sides.a, sides.b)

    def finish(self, value) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], dict]:
        """(ab, aa, bb) of :func:`vitviz.analyses.similarity.minibatch_sums`, and the sides in words."""
        index, grams_a, grams_b, sides = value
        return minibatch_sums(grams_a, grams_b, sides["same_model"], self.replicates, self.seed, index), sides


class CKASums:
    """The running sums of one run of the command, durable in ``DIR/.vitviz-similarity-parts/sums.npz``: after each
    finished minibatch, the sums of minibatches 0 .. k (added in minibatch order, as :func:`similarity` adds them),
    written whole in place of the previous ones. Its size is that of the sums, whatever the number of images.

    Args:
        folder: the output folder.
        key: the run's settings in one string (models, images, minibatches, point, pooling, kernel, bootstrap): sums of
            another key are another run's and are dropped.
    """

    NAME = "sums.npz"

    def __init__(self, folder: Path, key: str):
        self.folder, self.key = Path(folder) / ".vitviz-similarity-parts", key

    def read(self) -> tuple[dict | None, bool]:
        """(the state :meth:`write` wrote, or None; whether sums of other settings were dropped)."""
        path = self.folder / self.NAME
        if not path.exists():
            return None, False
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            if meta["key"] != self.key:
                self.clear()
                return None, True
            accumulator = MinibatchCKA(*stored["ab"].shape[1:], replicates=stored["ab"].shape[0] - 1)
            accumulator.add(stored["ab"], stored["aa"], stored["bb"], images=meta["images"])
            accumulator.batches = meta["batches"]
        return {"next": meta["next"], "accumulator": accumulator, "sides": meta["sides"],
                "skipped": dict(meta["skipped"])}, False

    def write(self, following: int, accumulator: MinibatchCKA, sides: dict, skipped: dict[str, str]) -> None:
        """The sums of every minibatch before ``following`` (0-based), the sides in words, the files skipped so far."""
        import io

        from ..io.atomic import atomic_write_bytes

        self.folder.mkdir(exist_ok=True)
        meta = {"key": self.key, "next": following, "batches": accumulator.batches, "images": accumulator.images,
                "sides": sides, "skipped": list(skipped.items())}
        buffer = io.BytesIO()
        np.savez(buffer, ab=accumulator.ab, aa=accumulator.aa, bb=accumulator.bb, meta=np.array(json.dumps(meta)))
        atomic_write_bytes(self.folder / self.NAME, buffer.getvalue())

    def clear(self) -> None:
        """Remove the sums and their folder (the result is written, or they were another run's)."""
        (self.folder / self.NAME).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass


def _grams(side, pictures: list, pooling: str, kernel: str, threshold: float) -> torch.Tensor:
    """(L, n, n) float64 Gram matrices of one side's layers for one minibatch."""
    features = side.features(side.preprocess(pictures), pooling)
    # float64 on the model's device (CUDA has it), on the host for MPS (which has no float64)
    return torch.stack([gram(f.float().cpu() if f.device.type == "mps" else f.float(), kernel, threshold)
                        for f in features])
