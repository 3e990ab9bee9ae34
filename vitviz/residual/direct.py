"""Direct contributions: the target (a class logit, the probe's class, a projection) split into what each part of
the residual stream wrote into it.

The last block's output is a sum: r = embed + Σ_l (Σ_h head_{l,h} + attn_bias_l + mlp_l), where head h of block l
writes its slice of the output projection applied to its context z (times LayerScale where the model has it),
``attn_bias`` is the projection's bias (times LayerScale) and ``mlp`` the MLP branch. With the readout's norms frozen
at the image's own scale (:mod:`vitviz.residual.frozen`) the target is affine in r: target = J · r + b, J the gradient
of the frozen readout, b its value at r = 0 (the norms' β and the head's bias: the component ``bias``). So

    target = J · embed + Σ_l Σ_h J · head_{l,h} + Σ_l J · attn_bias_l + Σ_l J · mlp_l + b

exactly, whatever the pooling (CLS, the mean of the patch tokens, both for a probe: J is zero where the head does not
read). A head's contribution splits further by the token it read from (its source patch):
J · head_{l,h} = Σ_s Σ_q A[q, s] · (v_s W_h) · J_q, the s-th term being what that head moved from token s into the
answer. :func:`readout` returns both, and checks that the parts add up to the model's own target value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..adapters import Hooks
from ..errors import OptionError
from ..explainers.targets import Target, default_target, for_lens
from ..layout import TokenLayout
from ..trace import Trace
from .frozen import FrozenNorms, ReadoutNotApplicable

COMPONENTS = ("embed", "attn_head", "attn_bias", "mlp", "bias")


@dataclass
class Readout:
    """A target split into direct contributions, for a batch of B images (L blocks, H heads).

    Layers and heads are 0-based in arrays and in :meth:`table` (1-based on screen).

    Attributes:
        total: (B,) the target as the model's own forward computes it.
        embed: (B,) the embedding's contribution (patch + position embeddings, prefix tokens).
        heads: (B, L, H) each attention head's.
        attn_bias: (B, L) each attention output projection's bias.
        mlp: (B, L) each MLP's.
        bias: (B,) the readout's constant: the frozen norms' β and the head's bias.
        head_sources: (B, L, H, N) each head's contribution split by the token it read from (sums to ``heads``);
            None when not asked for.
        target: the bound target (its ``text()`` says what was read out).
        layout: the token layout (prefix tokens, patch grid) of the input.
        images: the images' names, in batch order.
    """

    total: np.ndarray
    embed: np.ndarray
    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    bias: np.ndarray
    head_sources: np.ndarray | None
    target: Target
    layout: TokenLayout
    images: list[str] = field(default_factory=list)

    @property
    def parts_sum(self) -> np.ndarray:
        """(B,) the sum of every contribution and the constant (equals :attr:`total` up to rounding)."""
        return (self.embed + self.heads.sum((1, 2)) + self.attn_bias.sum(1) + self.mlp.sum(1) + self.bias)

    @property
    def residual(self) -> np.ndarray:
        """(B,) total − the sum of the parts: what rounding left (the model's forward runs in its own precision)."""
        return self.total - self.parts_sum

    def table(self) -> pd.DataFrame:
        """One row per image and component: ``image`` (0-based), ``name`` (the image's name), ``component``
        (embed, attn_head, attn_bias, mlp, bias), ``layer`` and ``head`` (0-based; empty where they do not apply),
        ``value`` (the contribution, in the target's units)."""
        B, L, H = self.heads.shape
        rows = []
        for b in range(B):
            name = self.images[b] if b < len(self.images) else f"image {b + 1}"
            rows.append((b, name, "embed", None, None, self.embed[b]))
            for l in range(L):
                rows.extend((b, name, "attn_head", l, h, self.heads[b, l, h]) for h in range(H))
                rows.append((b, name, "attn_bias", l, None, self.attn_bias[b, l]))
                rows.append((b, name, "mlp", l, None, self.mlp[b, l]))
            rows.append((b, name, "bias", None, None, self.bias[b]))
        table = pd.DataFrame(rows, columns=["image", "name", "component", "layer", "head", "value"])
        for column in ("layer", "head"):
            table[column] = table[column].astype("Int64")
        table["value"] = table["value"].astype(float)
        return table

    def patches(self, layer: int, head: int) -> np.ndarray:
        """(B, gh, gw) what head ``head`` of block ``layer`` (0-based) moved from each patch into the target; the
        prefix tokens' shares (CLS, registers) are in :attr:`head_sources` and not on the grid."""
        return self.patch_maps()[:, layer, head]

    def patch_maps(self) -> np.ndarray:
        """(B, L, H, gh, gw) every head's :meth:`patches`."""
        return self.layout.patch_grid(self._sources())

    def source_split(self, layer: int, head: int, image: int = 0) -> tuple[float, float]:
        """Head ``head`` of block ``layer``'s contribution (0-based) split in two: what it read from the patches and
        what it read from the prefix tokens; the two add up to the head's contribution."""
        sources, prefix = self._sources()[image, layer, head], self.layout.num_prefix_tokens
        return float(sources[prefix:].sum()), float(sources[:prefix].sum())

    def heads_per_layer(self, image: int = 0) -> np.ndarray:
        """(L,) every head of each block together: the block's attention contribution less its bias."""
        return self.heads[image].sum(-1)

    def _sources(self) -> np.ndarray:
        """(B, L, H, N) :attr:`head_sources`, which a readout computed with ``sources=False`` lacks."""
        if self.head_sources is None:
            raise ValueError("this readout was computed without per-source shares (sources=False)")
        return self.head_sources

    def top_heads(self, k: int = 5, image: int | None = None) -> list[tuple[int, int, float]]:
        """The k heads with the largest |contribution| as (layer, head, value), 0-based; over the batch's mean
        contribution unless ``image`` is given."""
        values = self.heads.mean(0) if image is None else self.heads[image]
        order = np.argsort(-np.abs(values), axis=None)[:k]
        return [(int(i // values.shape[1]), int(i % values.shape[1]), float(values.flat[i])) for i in order]


def target_for(lens, cls: int | None = None, texts=()) -> Target | None:
    """The readout's target as the CLI and the app pick it: CLIP's score for ``texts`` when given (each image's best
    match), else the logit of class ``cls`` (None: each image's top-1), or None for a headless model (its pooled
    vector's projection, :func:`readout`'s default)."""
    if texts:
        from ..explainers.text import TextTarget

        return TextTarget(tuple(texts) if not isinstance(texts, str) else texts)
    from ..explainers.targets import ClassLogit

    return ClassLogit(cls, labels=lens.class_labels) if lens.has_head else None


def why_not(lens) -> str | None:
    """One sentence saying why the direct readout does not apply to ``lens``'s model, or None."""
    why = lens.loaded.why_not("readout")
    if why is None and any(lens.adapter.head_write(lens.model, l) is None for l in range(lens.num_layers)):
        why = (f"{lens.label}'s attention blocks do not say how their heads write into the residual stream, so the "
               "direct readout does not apply to it yet.")
    return why


def _frozen_readout(lens, tokens: torch.Tensor, target: Target) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient J (B, N, D) of the readout with frozen norms at the last block's tokens, and its value at zero
    tokens b (B,): target(r') = J · r' + b for every r' while the head is linear."""
    rules = FrozenNorms()
    keep = ("logits", "pooled")
    with torch.inference_mode(False), torch.enable_grad():
        x = tokens.detach().clone().requires_grad_(True)
        hooks = Hooks(keep=keep, rules=rules)
        lens.adapter.readout(lens.model, x, hooks)
        value = target(hooks.kept)
        (grad,) = torch.autograd.grad(value.sum(), x)
    rules.replay()
    with torch.no_grad():
        hooks = Hooks(keep=keep, rules=rules)
        lens.adapter.readout(lens.model, torch.zeros_like(tokens), hooks)
        constant = target(hooks.kept)
    return grad.detach(), constant.detach()


def check_trace(trace: Trace, inputs, point) -> None:
    """Refuse a ``trace=`` run on another batch than ``inputs`` (compared on ``point``'s batch axis)."""
    if trace[point].shape[0] != inputs.tensor.shape[0]:
        raise OptionError(f"trace= holds {trace[point].shape[0]} images and x {inputs.tensor.shape[0]}: it is the "
                          f"trace of another batch; pass the trace of these images.")


def readout_points(lens, sources: bool = True) -> list:
    """What :func:`readout` keeps of the forward (``keep=`` for :meth:`vitviz.Lens.trace`), so that a caller who
    also wants other points (the logit lens's ``"resid_post"``) runs one forward and passes its ``trace=``."""
    L = lens.num_layers
    keep = ["embed", "z", "mlp_out", "attn_out", ("resid_post", L - 1), "pooled"]
    keep += ["logits"] if lens.has_head else []
    return keep + (["attn", "v"] if sources else [])


def readout(lens, x, target: Target | None = None, sources: bool = True, tolerance: float = 1e-3,
            trace: Trace | None = None) -> Readout:
    """Split ``target`` into the direct contributions of every part of the residual stream.

    Args:
        lens: a :class:`vitviz.Lens` of a model that attends globally (ViT, DeiT, DINOv2, CLIP's vision tower, ...,
            and probe heads on them).
        x: images as :meth:`vitviz.Lens.trace` takes them (a :class:`ModelInput`, a tensor (B, 3, H, W), paths).
        target: a :class:`vitviz.ClassLogit` (default: each image's top-1 class), or for a headless model a
            :class:`vitviz.Projection` of the pooled vector (the default there); any target that reads ``logits``
            or ``pooled`` linearly.
        sources: also split each head's contribution by the token it read from (:meth:`Readout.patches`); costs
            one (B, H, N, N) product per block.
        tolerance: the largest |total − sum of parts| allowed, relative to the sum of the parts' magnitudes: more
            means the readout is not linear in the tokens and the split is refused.
        trace: a :class:`vitviz.Trace` of ``x`` already run, keeping at least :func:`readout_points`; without it the
            readout runs its own forward.

    Returns:
        Readout: ``total`` (B,), ``heads`` (B, L, H), ... and :meth:`Readout.table`.

    Raises:
        ReadoutNotApplicable: a model whose heads or readout cannot be split (window attention, attention pooling,
            a norm between heads and projection), with the reason.
    """
    why = why_not(lens)
    if why:
        raise ReadoutNotApplicable(why)
    inputs = lens.as_input(x)
    model, adapter, L = lens.model, lens.adapter, lens.num_layers
    target = for_lens(target or default_target(model), lens, linear=True)
    trace = trace if trace is not None else lens.trace(inputs, keep=readout_points(lens, sources))
    check_trace(trace, inputs, "embed")
    points = {k: trace[k].clone() for k in ("pooled", "logits") if k in trace}  # plain tensors: bind may keep them
    target = target.bind(points)
    total = target(points).double()
    J, constant = _frozen_readout(lens, trace["resid_post", L - 1], target)
    J = J.double()

    def dot(value: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B,)
        return (J * value.double()).sum((1, 2))

    embed = dot(trace["embed"])
    heads, attn_bias, mlp, head_sources = [], [], [], []
    for l in range(L):
        write = adapter.head_write(model, l)
        H = write.heads
        scaled = J if write.scale is None else J * write.scale.double()
        JW = (scaled @ write.weight.double()).unflatten(-1, (H, -1)).transpose(1, 2)  # (B, H, N, d)
        z = trace["z", l].double()
        heads.append((JW * z).sum((2, 3)))
        bias_l = torch.zeros_like(embed) if write.bias is None else scaled.sum(1) @ write.bias.double()
        attn_bias.append(bias_l)
        mlp.append(dot(trace["mlp_out", l]))
        branch = dot(trace["attn_out", l])
        if not torch.allclose(heads[-1].sum(1) + bias_l, branch, rtol=1e-4, atol=1e-4 * float(branch.abs().max()) + 1e-6):
            raise RuntimeError(f"block {l}: the heads' writes do not add up to the attention branch "
                               f"({adapter.name}'s head_write disagrees with its forward)")
        if sources:
            M = JW @ trace["v", l].double().transpose(-1, -2)  # (B, H, N_query, N_source)
            head_sources.append((trace["attn", l].double() * M).sum(2))
    result = Readout(
        total=total.cpu().numpy(), embed=embed.cpu().numpy(), heads=torch.stack(heads, 1).cpu().numpy(),
        attn_bias=torch.stack(attn_bias, 1).cpu().numpy(), mlp=torch.stack(mlp, 1).cpu().numpy(),
        bias=constant.double().cpu().numpy(),
        head_sources=torch.stack(head_sources, 1).cpu().numpy() if sources else None,
        target=target, layout=trace.layout, images=[s.name for s in (inputs.sources or [])])
    scale = (np.abs(result.embed) + np.abs(result.heads).sum((1, 2)) + np.abs(result.attn_bias).sum(1)
             + np.abs(result.mlp).sum(1) + np.abs(result.bias))
    off = np.abs(result.residual)
    if np.any(off > tolerance * scale + 1e-6):
        raise ReadoutNotApplicable(
            f"the direct contributions of {lens.label} do not add up to its own {target.text()} (off by "
            f"{off.max():.3g} of {scale.max():.3g}): its readout is not linear in the tokens, so it cannot be split.")
    return result


@dataclass
class DirectVectors:
    """Every component's direct contribution to a whole output vector (all C logits, or the pooled vector).

    Attributes:
        values: (B, K, P) component k's contribution to each of the P outputs; K = 1 + L·H + 2L in the order of
            :attr:`components`.
        constant: (B, P) the readout's constant (the frozen norms' β, the head's bias).
        total: (B, P) the point as the model's own forward computes it.
        components: K rows of (component, layer, head), 0-based, None where they do not apply.
        point: ``"logits"`` or ``"pooled"``.
        num_layers, num_heads: L and H.
    """

    values: np.ndarray
    constant: np.ndarray
    total: np.ndarray
    components: list[tuple[str, int | None, int | None]]
    point: str
    num_layers: int
    num_heads: int

    def heads(self) -> np.ndarray:
        """(B, L, H, P) each head's contribution."""
        B, _, P = self.values.shape
        return self.values[:, 1:1 + self.num_layers * self.num_heads].reshape(B, self.num_layers, self.num_heads, P)

    @property
    def residual(self) -> np.ndarray:
        """(B, P) total − (constant + the sum of the contributions)."""
        return self.total - self.constant - self.values.sum(1)


def direct_vectors(lens, x, point: str = "logits") -> DirectVectors:
    """Each component's direct contribution to every entry of ``point`` (one image at a time, so memory is
    K·N·D per image: 100 MB for ViT-B/16).

    Args:
        lens: a :class:`vitviz.Lens` the direct readout applies to (:func:`why_not`).
        x: images as :meth:`vitviz.Lens.trace` takes them.
        point: ``"logits"`` (every class: which classes a head writes toward) or ``"pooled"`` (the vector the head
            reads; CLIP: what is projected into the joint space).

    Returns:
        DirectVectors: ``values`` (B, K, P), ``heads()`` (B, L, H, P).
    """
    why = why_not(lens)
    if why:
        raise ReadoutNotApplicable(why)
    if point == "logits" and not lens.has_head:
        raise ReadoutNotApplicable(f"{lens.label} has no classifier head: read the pooled vector (point='pooled').")
    inputs = lens.as_input(x)
    model, adapter, L = lens.model, lens.adapter, lens.num_layers
    trace = lens.trace(inputs, keep=["embed", "z", "mlp_out", ("resid_post", L - 1), point])
    rules = FrozenNorms()
    with torch.no_grad():
        adapter.readout(model, trace["resid_post", L - 1], Hooks(keep=(point,), rules=rules))
    writes = [adapter.head_write(model, l) for l in range(L)]
    H = writes[0].heads
    components = [("embed", None, None)] + [("attn_head", l, h) for l in range(L) for h in range(H)] \
        + [("attn_bias", l, None) for l in range(L)] + [("mlp", l, None) for l in range(L)]
    values, constants = [], []
    B, N, D = trace["embed"].shape
    for b in range(B):
        parts = [trace["embed"][b][None]]
        for l, w in enumerate(writes):
            z = trace["z", l][b]  # (H, N, d)
            W = w.weight.unflatten(1, (w.heads, -1)).permute(1, 2, 0)  # (H, d, D)
            out = z @ W  # (H, N, D)
            parts.append(out if w.scale is None else out * w.scale)
        for w in writes:
            bias = torch.zeros(D, dtype=trace["embed"].dtype, device=trace["embed"].device) if w.bias is None \
                else (w.bias if w.scale is None else w.bias * w.scale)
            parts.append(bias.expand(1, N, D))
        parts += [trace["mlp_out", l][b][None] for l in range(L)]
        batch = torch.cat([torch.zeros(1, N, D, dtype=parts[0].dtype, device=parts[0].device)] + parts)
        hooks = Hooks(keep=(point,), rules=rules.replay(repeat=batch.shape[0], image=b))
        with torch.no_grad():
            adapter.readout(model, batch, hooks)
        out = hooks.kept[point].double()
        constants.append(out[0])
        values.append(out[1:] - out[0])
    return DirectVectors(torch.stack(values).cpu().numpy(), torch.stack(constants).cpu().numpy(),
                         trace[point].double().cpu().numpy(), components, point, L, H)


def head_effects(lens, x, heads: list[tuple[int, int]], target: Target | None = None) -> pd.DataFrame:
    """Each head's direct contribution beside its total effect: the target minus the target with that head's context
    ``z`` zeroed and the forward run on (later blocks then react, and the final norm's scale moves).

    Args:
        lens: as :func:`readout`.
        x: as :func:`readout`.
        heads: (layer, head) pairs, 0-based.
        target: as :func:`readout`.

    Returns:
        DataFrame with ``image`` (0-based), ``layer``, ``head`` (0-based), ``direct`` and ``total`` (target units).
    """
    result = readout(lens, x, target, sources=False)
    inputs = lens.as_input(x)
    point = "logits" if lens.has_head else "pooled"
    rows = []
    for layer, head in heads:
        def zero(value, _point, head=head):
            value = value.clone()
            value[:, head] = 0
            return value

        trace = lens.trace(inputs, keep=[point], edit={f"blocks.{layer}.z": zero})
        ablated = result.target({point: trace[point]}).double().cpu().numpy()
        rows.extend((b, layer, head, float(result.heads[b, layer, head]), float(result.total[b] - ablated[b]))
                    for b in range(len(ablated)))
    return pd.DataFrame(rows, columns=["image", "layer", "head", "direct", "total"])


def names_table(heads: np.ndarray, labels: tuple[str, ...] | None, k: int = 3) -> pd.DataFrame:
    """Each head's ``k`` classes from its (L, H, C) direct contributions to every logit (mean over images), each
    taken relative to the head's mean over all classes (a head adding the same amount to every logit moves no
    probability: softmax ignores it).

    Returns:
        DataFrame with ``layer``, ``head`` (0-based), ``rank`` (1 = first), ``class``, ``label`` and ``value`` (the
        relative contribution, logit units).
    """
    relative = heads - heads.mean(-1, keepdims=True)
    labels = labels or ()
    rows = []
    for l in range(relative.shape[0]):
        for h in range(relative.shape[1]):
            for rank, c in enumerate(np.argsort(-relative[l, h], kind="stable")[:k], 1):
                label = labels[c] if c < len(labels) else f"class {c}"
                rows.append((l, h, rank, int(c), label, float(relative[l, h, c])))
    return pd.DataFrame(rows, columns=["layer", "head", "rank", "class", "label", "value"])


def first_names(table: pd.DataFrame, layers: int, heads: int) -> np.ndarray:
    """(layers, heads) object array of each head's first class label in a :func:`names_table` ("" for a head the
    table does not name)."""
    names = np.full((layers, heads), "", dtype=object)
    for row in table[table["rank"] == 1].itertuples():
        names[row.layer, row.head] = row.label
    return names


def head_names(lens, x, k: int = 3) -> pd.DataFrame:
    """What each head writes toward, in class names, over the images ``x`` (:func:`names_table` of the mean of
    :func:`direct_vectors`' heads)."""
    return names_table(direct_vectors(lens, x, point="logits").heads().mean(0), lens.class_labels, k)
