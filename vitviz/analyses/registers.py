"""What distorts the maps, and its repair: high-norm outlier tokens, register neurons, the test-time
register, sink masking and trained registers.

Large ViTs write a few high-norm "outlier" tokens into background patches, and attention to them drowns
the maps (Darcet et al. 2024, "Vision Transformers Need Registers"). Jiang et al. 2025 ("Vision
Transformers Don't Need Trained Registers", code ``nickjiang2378/test-time-registers``) found that a few
MLP neurons write them, and that moving those neurons' activation onto one extra token at test time
cleans the maps while the output stays the same. Everything here runs through the adapters' named points
(``blocks.i.resid_post`` to read norms, ``blocks.i.mlp_hidden`` to read and move neurons, ``embed`` to
insert the extra token, ``blocks.i.attn`` to mask keys), so it applies to every family an adapter reads.
Reading the outliers and searching the neurons live in :mod:`vitviz.analyses.outliers`; every name of it is
importable from here too.

Layers are 0-based in arrays and in these functions; every file and screen a user reads says 1-based.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..adapters import adapter_for, compose_edits, point_name  # noqa: F401  (compose_edits: re-exported)
from ..errors import FileContentError, OptionError
from ..layout import TokenLayout
from ..lens import Lens
from ..tensors import to_host
from .outliers import (EMERGENCE_SHARE, OUTLIER_FACTOR, SEARCH_RULE, Outliers, RegisterNeuron, Search,  # noqa: F401
                       find_outliers, outlier_rule, search_register_neurons, token_norms)
from .tokens import AttentionSinks

EXTRA_TOKEN = "test_time_reg"


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
        out = Lens.around(model).trace(blank, keep=names, stop_after=names[-1], grad=None)
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
    lens = Lens.around(model)
    keep = ("pooled", "logits") if lens.has_head else ("pooled",)
    return output_change(lens.trace(x, keep=keep, grad=None), lens.trace(x, keep=keep, edit=edit, grad=None))


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

    def last_layer(self, head: int | None = None) -> np.ndarray:
        """(2, gh, gw) the last layer's readout attention before and after: head ``head`` (0-based), or the mean over
        the heads (None)."""
        pick = (lambda a: a.mean(axis=0)) if head is None else (lambda a: a[head])
        return np.stack([pick(self.heads_before), pick(self.heads_after)])

    def norm_ratio(self, after: bool) -> float:
        """The largest patch-token norm over the median in the last layer, before or after the repair."""
        norms, layout = (self.norms_after, self.layout_after) if after else (self.norms_before, self.layout_before)
        return float(find_outliers(norms[None, -1:], layout).ratio[0, 0])  # Outliers.ratio's rule, not a copy

    def extra_token_norm(self) -> tuple[float, float] | None:
        """The repair's extra token's norm in the last layer and the median patch norm there (after the repair); None
        when the repair adds no token."""
        extra = [i for i, n in enumerate(self.layout_after.prefix_tokens) if n not in self.layout_before.prefix_tokens]
        if not extra:
            return None
        last = self.norms_after[-1]
        return float(last[extra[0]]), float(np.median(last[self.layout_after.patch_slice]))


def _readout_maps(attention: np.ndarray, layout: TokenLayout) -> tuple[np.ndarray, np.ndarray]:
    from .maps import query_attention_map
    from .rollout import rollout

    query = "cls" if layout.has_class_token else "mean"
    heads = np.stack([query_attention_map(attention, layout, -1, h, query) for h in range(attention.shape[1])])
    return heads, rollout(attention, layout).map


def repair_maps(model, x: torch.Tensor, layout: TokenLayout, edit: dict, after_layout: TokenLayout | None = None) -> RepairMaps:
    """Capture one image (x: (1, 3, H, W)) as the model is and with ``edit`` (a repair whose runs have
    ``after_layout``, default ``layout``): last-layer heads, rollout, norms and the output change."""
    from .per_image import analysis_trace

    lens, after_layout = Lens.around(model), after_layout or layout
    before = analysis_trace(lens, x, layout=layout)
    after = analysis_trace(lens, x, edit=edit, layout=after_layout)
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
    out = Lens.around(model).trace(x, keep=names, stop_after=names[-1], grad=None)
    return np.stack([layout.to_grid(to_host(out[point_name("mlp_hidden", n.layer)][0, layout.patch_slice, n.index]))
                     for n in neurons])
