"""What distorts the maps, and its repair: high-norm outlier tokens, register neurons, the test-time
register, sink masking and trained registers.

Large ViTs write a few high-norm "outlier" tokens into background patches, and attention to them drowns
the maps (Darcet et al. 2024, "Vision Transformers Need Registers"). Jiang et al. 2025 ("Vision
Transformers Don't Need Trained Registers", code ``nickjiang2378/test-time-registers``) found that a few
MLP neurons write them, and that moving those neurons' activation onto one extra token at test time
cleans the maps while the output stays the same. Everything here runs through the adapters' named points
(``blocks.i.resid_post`` to read norms, ``blocks.i.mlp_hidden`` to read and move neurons, ``embed`` to
insert the extra token, ``blocks.i.attn`` to mask keys), so it applies to every family an adapter reads.

Layers are 0-based in arrays and in these functions; every file and screen a user reads says 1-based.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np
import torch

from ..adapters import adapter_for, compose_edits, point_name
from ..trace import trace_model
from ..errors import FileContentError, OptionError, ViewNotApplicable
from ..layout import TokenLayout
from ..tensors import to_host
from .tokens import ARTIFACT_FACTOR, AttentionSinks

OUTLIER_FACTOR = ARTIFACT_FACTOR
EXTRA_TOKEN = "test_time_reg"
EMERGENCE_SHARE = 0.5


def outlier_rule(factor: float = OUTLIER_FACTOR) -> str:
    """The outlier rule in words (settings, registers.json and the page say the same)."""
    return (f"a patch token is an outlier in a layer when its output norm (the block's output, before the final "
            f"norm) exceeds {factor:g} x the median patch-token norm of that image in that layer")


# ---------------------------------------------------------------------------------------------
# Reading: norms and outliers


@torch.inference_mode()
def token_norms(model, x: torch.Tensor, edit=None) -> torch.Tensor:
    """The L2 norm of every token leaving every block: (B, 3, H, W) -> (B, L, N) float32 on the model's device.

    ``edit``: the adapters' ``edit=`` run in the same forward (e.g. a repair; then N counts its tokens).
    """
    norms: dict[int, torch.Tensor] = {}

    def keep(value, point):
        norms[point.layer] = value.float().norm(dim=-1)
        return value

    trace_model(model, x, edit=compose_edits(edit, {"blocks.*.resid_post": keep}),
                stop_after=point_name("resid_post", adapter_for(model).num_layers(model) - 1), grad=None)
    return torch.stack([norms[i] for i in range(len(norms))], dim=1)


@dataclass
class Outliers:
    """High-norm patch tokens of an image set, layer by layer.

    Attributes:
        norms: (B, L, N) token norms leaving each block (prefix tokens first).
        layout: the token layout of N.
        factor: the rule's multiple of the median patch norm (:func:`outlier_rule`).
        median: (B, L) median patch-token norm per image and layer.
        mask: (B, L, P) patch tokens above ``factor`` x ``median`` (raster order).
    """

    norms: np.ndarray
    layout: TokenLayout
    factor: float
    median: np.ndarray
    mask: np.ndarray

    @property
    def threshold(self) -> np.ndarray:
        """(B, L) the norm above which a patch is an outlier."""
        return self.factor * self.median

    @property
    def ratio(self) -> np.ndarray:
        """(B, L) the largest patch norm over the median patch norm."""
        return self.norms[:, :, self.layout.patch_slice].max(axis=-1) / self.median

    @property
    def images_per_layer(self) -> np.ndarray:
        """(L,) images with at least one outlier in each layer."""
        return self.mask.any(axis=-1).sum(axis=0)

    @property
    def any(self) -> bool:
        return bool(self.mask.any())

    @property
    def emergence_layer(self) -> int | None:
        """The first layer (0-based) whose count of images with outliers reaches ``EMERGENCE_SHARE`` of the
        largest count over layers (a stray token in one early layer does not count); None without outliers."""
        counts = self.images_per_layer
        if counts.max() == 0:
            return None
        return int(np.flatnonzero(counts >= EMERGENCE_SHARE * counts.max())[0])

    def positions(self, layer: int) -> list[np.ndarray]:
        """Per image, the outlier patches of ``layer`` (raster indices, 0-based)."""
        return [np.flatnonzero(m) for m in self.mask[:, layer]]

    def percentiles(self, q=(50, 99, 100)) -> np.ndarray:
        """(len(q), L) percentiles of the patch norms per layer over every image's patches."""
        patch = self.norms[:, :, self.layout.patch_slice]
        return np.percentile(patch.transpose(1, 0, 2).reshape(patch.shape[1], -1), q, axis=1)


def find_outliers(norms: np.ndarray, layout: TokenLayout, factor: float = OUTLIER_FACTOR) -> Outliers:
    """Apply the outlier rule (:func:`outlier_rule`) to token norms: (B, L, N) -> :class:`Outliers`."""
    if factor <= 1:
        raise OptionError(f"The outlier factor must be above 1 (a multiple of the median norm), not {factor:g}.")
    norms = np.asarray(norms, dtype=np.float64)
    patch = norms[:, :, layout.patch_slice]
    median = np.median(patch, axis=-1)
    return Outliers(norms=norms, layout=layout, factor=float(factor), median=median,
                    mask=patch > factor * median[..., None])


# ---------------------------------------------------------------------------------------------
# The register-neuron search (Jiang et al. 2025, ``find_register_neurons``)


@dataclass(frozen=True)
class RegisterNeuron:
    """One MLP hidden unit (after the activation): ``layer`` 0-based, ``index`` into the hidden units,
    ``score`` its mean |activation| at the outlier positions."""

    layer: int
    index: int
    score: float

    def to_dict(self) -> dict:
        """As registers.json writes it: layer 1-based."""
        return {"layer": self.layer + 1, "index": self.index, "score": self.score}


SEARCH_RULE = ("each MLP hidden unit (after the activation) of the layers up to and including the emergence layer "
               "is scored by its mean |activation| at the image's outlier patches of the detection layer, averaged "
               "over the images that have outliers; best first (Jiang et al. 2025)")


@dataclass
class Search:
    """What :func:`search_register_neurons` found.

    Attributes:
        outliers: the norms and outliers of the set.
        detect_layer: the layer (0-based) whose outliers were the positions.
        scores: (L, D_mlp) mean |activation| at the outlier positions (NaN: no image had outliers).
        neurons: the ranked units of the layers up to the emergence layer, best first (empty without outliers).
        images_with_outliers: how many images the scores average over.
    """

    outliers: Outliers
    detect_layer: int
    scores: np.ndarray
    neurons: list[RegisterNeuron]
    images_with_outliers: int

    def to_json(self) -> dict:
        """registers.json: ``threshold`` (the factor), ``emergence_layer`` and ``detect_layer`` 1-based,
        ``neurons`` best first with 1-based layers, and the rules in words."""
        o = self.outliers
        emergence = o.emergence_layer
        return {
            "threshold": o.factor,
            "threshold_rule": outlier_rule(o.factor),
            "emergence_layer": None if emergence is None else emergence + 1,
            "emergence_rule": f"the first layer in which at least {EMERGENCE_SHARE:.0%} as many images have an "
                              "outlier as in the layer with the most",
            "detect_layer": self.detect_layer + 1,
            "images": int(o.norms.shape[0]),
            "images_with_outliers": self.images_with_outliers,
            "search_rule": SEARCH_RULE,
            "neurons": [n.to_dict() for n in self.neurons],
            "token_layout": o.layout.to_dict(),
        }


def _check_hidden_point(model, x: torch.Tensor) -> None:
    """A sentence when the family's MLP has no ``mlp_hidden`` point (its class is not spelled out)."""
    name = point_name("mlp_hidden", 0)
    if name not in trace_model(model, x[:1], keep=(name,), stop_after=point_name("resid_post", 0), grad=None):
        raise ViewNotApplicable(f"{type(model).__name__}'s MLP is run as its own module here: its hidden units "
                                "cannot be read, so there are no register neurons to search.")


def search_register_neurons(model, batches: Iterable[torch.Tensor], layout: TokenLayout,
                            factor: float = OUTLIER_FACTOR, detect_layer: int = -1, top: int | None = 50) -> Search:
    """Rank the MLP hidden units that write the outliers (Jiang et al. 2025), one forward per batch.

    Each forward reads every block's output norms and hidden units (``blocks.i.resid_post``,
    ``blocks.i.mlp_hidden``) and keeps, per image, each unit's mean |activation| at that image's outlier
    patches of ``detect_layer`` (B x L x D_mlp floats); the ranking is made once the set is in, over the
    layers up to the emergence layer (known only then).

    Args:
        model: a model an adapter reads.
        batches: (b, 3, H, W) normalised inputs on the model's device.
        layout: their token layout.
        factor: the outlier rule's multiple of the median patch norm.
        detect_layer: the layer (0-based; -1 the last, Jiang et al.'s default) whose outliers are the positions.
        top: keep the best ``top`` units (None: every unit of the searched layers).
    """
    depth = adapter_for(model).num_layers(model)
    detect = detect_layer % depth
    all_norms, all_scores = [], []
    for x in batches:
        if not all_norms:
            _check_hidden_point(model, x)
        hidden: dict[int, torch.Tensor] = {}
        norms: dict[int, torch.Tensor] = {}

        def keep_hidden(value, point):
            hidden[point.layer] = value.detach()
            return value

        def keep_norm(value, point):
            norms[point.layer] = value.detach().float().norm(dim=-1)
            return value

        with torch.inference_mode():
            trace_model(model, x, edit={"blocks.*.mlp_hidden": keep_hidden, "blocks.*.resid_post": keep_norm},
                        stop_after=point_name("resid_post", depth - 1), grad=None)
            n = torch.stack([norms[i] for i in range(depth)], dim=1)  # (b, L, N)
            patch = n[:, detect, layout.patch_slice]
            mask = patch > factor * patch.quantile(0.5, dim=-1, keepdim=True)  # (b, P), numpy's median
            weights = mask.float() / mask.sum(dim=-1, keepdim=True).clamp_min(1)  # the mean over the outliers
            scores = torch.stack([torch.einsum("bp,bpk->bk", weights, hidden[i][:, layout.patch_slice].float().abs())
                                  for i in range(depth)], dim=1)  # (b, L, D_mlp)
        all_norms.append(to_host(n))
        all_scores.append(to_host(scores))
    outliers = find_outliers(np.concatenate(all_norms), layout, factor)
    has = outliers.mask[:, detect].any(axis=-1)
    emergence = outliers.emergence_layer
    per_image = np.concatenate(all_scores)
    if emergence is None or not has.any():
        return Search(outliers, detect, np.full(per_image.shape[1:], np.nan), [], 0)
    scores = per_image[has].mean(axis=0)
    searched = scores[:emergence + 1]
    D = searched.shape[1]
    order = np.argsort(-searched, axis=None, kind="stable")
    if top is not None:
        order = order[:top]
    neurons = [RegisterNeuron(int(i // D), int(i % D), float(searched.flat[i])) for i in order]
    return Search(outliers, detect, scores, neurons, int(has.sum()))


# ---------------------------------------------------------------------------------------------
# The repairs, as ``edit=`` mappings


def why_no_register(model) -> str | None:
    """One sentence when the test-time register cannot run through ``model``'s forward, else None."""
    why = adapter_for(model).why_no_extra_token(model)
    return None if why is None else f"The test-time register cannot be added to this model: {why}."


@dataclass(frozen=True)
class TestTimeRegister:
    """The test-time register of Jiang et al. 2025: one extra token, and the register neurons moved onto it.

    One token is inserted at ``embed`` right after the model's own prefix tokens (so it is one more prefix
    token); in each chosen neuron's layer, the neuron's activation is set to 0 at every patch token and to
    its maximum over the image's patch tokens at the extra token (Jiang et al. take the maximum over all
    tokens and leave CLS as it is: so does this, but over the patches only).

    Args:
        neurons: (layer 0-based, hidden-unit index) pairs.
        init: the extra token entering block 1: ``"zero"`` (as Jiang et al.'s code) or ``"mean"`` (the mean
            of the patch tokens, position embedding included).
    """

    __test__ = False  # not a pytest class

    neurons: tuple[tuple[int, int], ...]
    init: str = "zero"

    def __post_init__(self):
        if self.init not in ("zero", "mean"):
            raise OptionError(f"The extra token starts as 'zero' or 'mean', not {self.init!r}.")

    def layout(self, layout: TokenLayout) -> TokenLayout:
        """The model's layout with the extra token as one more prefix token, after the model's own."""
        return replace(layout, prefix_tokens=layout.prefix_tokens + (EXTRA_TOKEN,))

    def edit(self, layout: TokenLayout) -> dict:
        """The ``edit=`` of the adapters that runs the register, for inputs of the model's own ``layout``."""
        at = layout.num_prefix_tokens  # the extra token's index; patches follow it

        def insert(x, point):
            extra = x[:, at:].mean(dim=1, keepdim=True) if self.init == "mean" else x.new_zeros(x.shape[0], 1, x.shape[2])
            return torch.cat([x[:, :at], extra, x[:, at:]], dim=1)

        by_layer: dict[int, list[int]] = {}
        for layer, index in self.neurons:
            by_layer.setdefault(int(layer), []).append(int(index))

        def move(h, point):
            idx = torch.as_tensor(by_layer[point.layer], device=h.device)
            patches = h[:, at + 1:, idx]
            h = h.clone()
            h[:, at, idx] = patches.max(dim=1).values
            h[:, at + 1:, idx] = 0
            return h

        return {"embed": insert} | {point_name("mlp_hidden", layer): move for layer in by_layer}

    def to_dict(self) -> dict:
        return {"neurons": [{"layer": layer + 1, "index": index} for layer, index in self.neurons], "init": self.init,
                "token": EXTRA_TOKEN,
                "rule": "one token inserted after the model's own prefix tokens; in each neuron's layer its activation "
                        "is 0 at every patch token and its maximum over the image's patch tokens at the extra token"}


def register_from_json(data: dict, k: int | None = None, init: str = "zero") -> TestTimeRegister:
    """The test-time register of registers.json's best ``k`` neurons (default all it lists)."""
    neurons = data.get("neurons")
    if not isinstance(neurons, list) or not neurons:
        raise FileContentError("lists no register neurons (its model had no outliers: nothing to repair)")
    chosen = neurons if k is None else neurons[:k]
    try:
        return TestTimeRegister(tuple((int(n["layer"]) - 1, int(n["index"])) for n in chosen), init)
    except (KeyError, TypeError, ValueError) as exc:
        raise FileContentError("has a neuron without an integer 'layer' and 'index'") from exc


def check_register(model, register: TestTimeRegister, layout: TokenLayout) -> None:
    """A sentence when ``register``'s neurons do not exist in ``model`` (a registers.json of another model).

    The hidden widths are read from one forward of a blank input up to the last named layer (no module is
    asked: only the adapters know a family's modules)."""
    depth = adapter_for(model).num_layers(model)
    for layer, _ in register.neurons:
        if not 0 <= layer < depth:
            raise FileContentError(f"names layer {layer + 1}, and this model has {depth}")
    names = [point_name("mlp_hidden", layer) for layer in sorted({layer for layer, _ in register.neurons})]
    param = next(model.parameters())
    (gh, gw), (ph, pw) = layout.grid_size, layout.patch_size
    with torch.inference_mode():
        blank = torch.zeros(1, 3, gh * ph, gw * pw, device=param.device, dtype=param.dtype)
        out = trace_model(model, blank, keep=names, stop_after=names[-1], grad=None)
    for layer, index in register.neurons:
        name = point_name("mlp_hidden", layer)
        if name not in out:
            raise FileContentError(f"names layer {layer + 1}, whose MLP this model runs as its own module (its "
                                   "hidden units cannot be read or moved)")
        width = out[name].shape[-1]
        if not 0 <= index < width:
            raise FileContentError(f"names hidden unit {index} of layer {layer + 1}, which has {width}")


def mask_keys(masked: torch.Tensor) -> dict:
    """Sink masking as an ``edit=``: in every layer, attention to the masked tokens is dropped and each row
    renormalised (today's ``--exclude-sinks`` does the same to the maps after the forward; here the forward runs
    on, so the output changes too).

    masked: (B, L, N) bool, True where token n is masked as a key in layer l of image b.
    """

    def drop(a, point):
        keep = (~masked[:, point.layer]).to(a.dtype)[:, None, None, :]
        a = a * keep
        return a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)

    return {"blocks.*.attn": drop}


def sink_mask(sinks: list[AttentionSinks], layout: TokenLayout, device=None) -> torch.Tensor:
    """(B, L, N) bool: the patch sinks of each image and layer (prefix tokens are never masked)."""
    L = len(sinks[0].sinks)
    mask = torch.zeros(len(sinks), L, layout.num_tokens, dtype=torch.bool)
    for b, s in enumerate(sinks):
        for layer, tokens in enumerate(s.sinks):
            tokens = tokens[tokens >= layout.num_prefix_tokens]
            mask[b, layer, torch.as_tensor(tokens, dtype=torch.long)] = True
    return mask.to(device) if device is not None else mask


def outlier_mask(outliers: Outliers, device=None) -> torch.Tensor:
    """(B, L, N) bool: the outlier patches of each image and layer, as keys to drop."""
    B, L, _ = outliers.mask.shape
    mask = torch.zeros(B, L, outliers.layout.num_tokens, dtype=torch.bool)
    mask[:, :, outliers.layout.patch_slice] = torch.as_tensor(outliers.mask)
    return mask.to(device) if device is not None else mask


def trained_register_mask(layout: TokenLayout, layers: int, device=None) -> torch.Tensor:
    """(1, L, N) bool: the model's trained register tokens (``reg0``, ``reg1``, ...) as keys to drop in every layer."""
    mask = torch.zeros(1, layers, layout.num_tokens, dtype=torch.bool)
    for i, name in enumerate(layout.prefix_tokens):
        if name.startswith("reg"):
            mask[:, :, i] = True
    return mask.to(device) if device is not None else mask


REPAIRS = {"none": "none", "sinks": "sink masking", "register": "test-time register",
           "trained": "trained registers dropped"}


@dataclass(frozen=True)
class Repair:
    """One repair of what distorts the maps, run inside the forward (the pages' "Repair" choice).

    Args:
        kind: ``"none"``, ``"sinks"`` (each layer's patch sinks dropped as keys, rows renormalised),
            ``"register"`` (the test-time ``register``) or ``"trained"`` (the model's trained registers dropped as
            keys in every layer, rows renormalised).
        register: the test-time register, for ``kind="register"``.
    """

    kind: str = "none"
    register: TestTimeRegister | None = None

    def __post_init__(self):
        if self.kind not in REPAIRS:
            raise OptionError(f"A repair is one of {', '.join(REPAIRS)}, not {self.kind!r}.")
        if (self.kind == "register") != (self.register is not None):
            raise ValueError("A test-time register repair needs its register (and only it does).")

    @property
    def name(self) -> str:
        return REPAIRS[self.kind]

    def why_not(self, model, layout: TokenLayout) -> str | None:
        """One sentence when this repair cannot run on ``model``, else None."""
        if self.kind == "register":
            return why_no_register(model)
        if self.kind == "trained" and not any(n.startswith("reg") for n in layout.prefix_tokens):
            return "This model has no trained register tokens to drop."
        return None

    def layout(self, layout: TokenLayout) -> TokenLayout:
        """The token layout of the repaired forward (the test-time register adds a prefix token)."""
        return self.register.layout(layout) if self.kind == "register" else layout

    def edit(self, model, layout: TokenLayout, sinks: list[AttentionSinks] | None = None, device=None) -> dict | None:
        """The ``edit=`` running this repair for inputs of the model's own ``layout`` (None for ``"none"``).

        sinks: per image of the batch, its sinks as the unrepaired forward found them (sink masking needs them)."""
        if self.kind == "none":
            return None
        if self.kind == "register":
            return self.register.edit(layout)
        if self.kind == "sinks":
            if sinks is None:
                raise ValueError("sink masking needs the sinks of the unrepaired forward")
            return mask_keys(sink_mask(sinks, layout, device))
        return mask_keys(trained_register_mask(layout, adapter_for(model).num_layers(model), device))

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "name": self.name}
        if self.kind == "sinks":
            out["rule"] = ("each layer's patch sinks (robust z-score above 8 and at least 10x the uniform share of "
                           "attention, found by the forward without the repair) dropped as keys in that layer, rows "
                           "renormalised, the forward run on")
        elif self.kind == "trained":
            out["rule"] = "the trained register tokens dropped as keys in every layer, rows renormalised"
        elif self.kind == "register":
            out |= self.register.to_dict()
        return out


# ---------------------------------------------------------------------------------------------
# What the repair cost


@dataclass
class OutputChange:
    """How a repair changed the model's output, per image.

    Attributes:
        pooled_cosine: (B,) cosine of the pooled vectors (the head's input) before and after.
        top1_agrees: (B,) whether the top-1 class is the same (classifiers), else None.
        top1_logit_change: (B,) after - before of the logit of the original top-1 class, else None.
        max_logit_change: (B,) the largest |after - before| over classes, else None.
    """

    pooled_cosine: np.ndarray
    top1_agrees: np.ndarray | None = None
    top1_logit_change: np.ndarray | None = None
    max_logit_change: np.ndarray | None = None

    def to_dict(self) -> dict:
        out = {"pooled_cosine": self.pooled_cosine.tolist()}
        if self.top1_agrees is not None:
            out |= {"top1_agrees": self.top1_agrees.tolist(), "top1_logit_change": self.top1_logit_change.tolist(),
                    "max_logit_change": self.max_logit_change.tolist()}
        return out


def output_change(before: dict, after: dict) -> OutputChange:
    """Compare two runs' ``pooled`` (B, D) and, when both have them, ``logits`` (B, C)."""
    p0, p1 = (to_host(d["pooled"]).astype(np.float64) for d in (before, after))
    cos = (p0 * p1).sum(-1) / np.maximum(np.linalg.norm(p0, axis=-1) * np.linalg.norm(p1, axis=-1), 1e-300)
    if "logits" not in before or "logits" not in after:
        return OutputChange(cos)
    l0, l1 = (to_host(d["logits"]).astype(np.float64) for d in (before, after))
    top = l0.argmax(-1)
    rows = np.arange(len(top))
    return OutputChange(cos, top == l1.argmax(-1), l1[rows, top] - l0[rows, top], np.abs(l1 - l0).max(-1))


@torch.inference_mode()
def compare_outputs(model, x: torch.Tensor, edit: dict) -> OutputChange:
    """One forward as the model is and one with ``edit``: their :class:`OutputChange`."""
    keep = ("pooled", "logits") if adapter_for(model).num_classes(model) > 0 else ("pooled",)
    return output_change(trace_model(model, x, keep=keep, grad=None),
                         trace_model(model, x, keep=keep, edit=edit, grad=None))


# ---------------------------------------------------------------------------------------------
# Before and after, for one image (the registers page)


@dataclass
class RepairMaps:
    """One image before and after a repair: what the registers page draws side by side.

    Attributes:
        heads_before, heads_after: (H, gh, gw) the last layer's attention of the readout (CLS, else the mean
            patch query) on the patches, per head.
        rollout_before, rollout_after: (gh, gw) attention rollout of the readout over all layers.
        norms_before, norms_after: (L, N) and (L, N') token output norms (N' counts an extra token).
        layout_before, layout_after: the token layouts of the two runs.
        change: the output change (pooled cosine; top-1 and logits for classifiers).
    """

    heads_before: np.ndarray
    heads_after: np.ndarray
    rollout_before: np.ndarray
    rollout_after: np.ndarray
    norms_before: np.ndarray
    norms_after: np.ndarray
    layout_before: TokenLayout
    layout_after: TokenLayout
    change: OutputChange


def _readout_maps(attention: np.ndarray, layout: TokenLayout) -> tuple[np.ndarray, np.ndarray]:
    from .maps import query_attention_map
    from .rollout import rollout

    query = "cls" if layout.has_class_token else "mean"
    heads = np.stack([query_attention_map(attention, layout, -1, h, query) for h in range(attention.shape[1])])
    return heads, rollout(attention, layout).map


def repair_maps(model, x: torch.Tensor, layout: TokenLayout, edit: dict, after_layout: TokenLayout | None = None) -> RepairMaps:
    """Capture one image (x: (1, 3, H, W)) as the model is and with ``edit`` (a repair whose runs have
    ``after_layout``, default ``layout``): last-layer heads, rollout, norms and the output change."""
    from ..trace import trace_for_analysis

    after_layout = after_layout or layout
    before = trace_for_analysis(model, x, layout=layout)
    after = trace_for_analysis(model, x, edit=edit, layout=after_layout)
    a0, a1 = to_host(before.stack("attn")[0]), to_host(after.stack("attn")[0])
    h0, r0 = _readout_maps(a0, layout)
    h1, r1 = _readout_maps(a1, after_layout)
    return RepairMaps(h0, h1, r0, r1, to_host(before.stack("resid_post.norm")[0]),
                      to_host(after.stack("resid_post.norm")[0]), layout,
                      after_layout, compare_outputs(model, x, edit))


@torch.inference_mode()
def neuron_maps(model, x: torch.Tensor, layout: TokenLayout, neurons: list[RegisterNeuron]) -> np.ndarray:
    """Each neuron's activation over the patches of one image (x: (1, 3, H, W)): (k, gh, gw); k = 0 (no forward)
    for an empty list (a search whose detection layer had no outliers ranks no neuron)."""
    if not neurons:
        return np.zeros((0, *layout.grid_size))
    names = [point_name("mlp_hidden", layer) for layer in sorted({n.layer for n in neurons})]
    out = trace_model(model, x, keep=names, stop_after=names[-1], grad=None)
    return np.stack([layout.to_grid(to_host(out[point_name("mlp_hidden", n.layer)][0, layout.patch_slice, n.index]))
                     for n in neurons])
