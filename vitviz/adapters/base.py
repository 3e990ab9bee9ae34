"""The adapter protocol: one spelled-out forward per model family, with named activation points.

Every family's forward is written out block by block from the module's own parameters and passes
each intermediate through :class:`Hooks` under a name that is the same for every family (the
vocabulary of TransformerLens, without its ``hook_`` prefix):

====================  ==========================================================================
point                 value
====================  ==========================================================================
``embed``             tokens entering block 1, position embedding added, prefix tokens in (B, N, D)
``blocks.i.resid_pre``  tokens entering block i (0-based) (B, N, D)
``blocks.i.ln1``      the attention's input after the block's first norm (B, N, D) (post-norm
                      blocks: the block input)
``blocks.i.q/k/v``    per head, as the dot product sees them (after q/k norm and rotary) (B, H, N, d)
``blocks.i.scores``   q·kᵀ · scale + biases and masks, before the softmax (B, H, N, N)
``blocks.i.attn``     the attention probabilities, float32, rows sum to 1 (B, H, N, N)
``blocks.i.z``        the heads' context, probabilities @ v (B, H, N, d)
``blocks.i.attn_out`` the attention branch after its output projection (B, N, D)
``blocks.i.resid_mid``  tokens after the attention's residual add (B, N, D)
``blocks.i.ln2``      the MLP's input after the block's second norm (B, N, D)
``blocks.i.mlp_hidden``  the MLP's hidden units after the activation (B, N, D_mlp)
``blocks.i.mlp_out``  the MLP branch's output (B, N, D)
``blocks.i.resid_post`` tokens leaving block i (B, N, D)
``final_norm``        the final norm's output (``forward_features``) (B, N, D)
``pooled``            the vector the head reads (``pre_logits``) (B, D)
``logits``            the classifier's output (B, C); absent without a head
====================  ==========================================================================

Window families (Swin, ``scope = "window"``) run the same names per block in window shapes
(:mod:`vitviz.adapters.windows`; nW windows of T = wh * ww slots on the stage's grid padded to whole
windows, in the library's partition order; H and D change from stage to stage):

- tokens on the stage's grid, (B, gh, gw, D): ``embed``, ``blocks.i.{resid_pre, ln1, attn_out, resid_mid, ln2,
  mlp_out, resid_post}``, ``final_norm``; ``blocks.i.mlp_hidden`` (B, gh, gw, D_mlp);
- ``blocks.i.q/k/v`` per window and head (B, nW, H, T, d) (Swin V2: q and k L2-normalised);
- ``blocks.i.scores``: q·kᵀ · scale (V2: its per-head logit scale) + relative position bias + shift
  mask (0 / -100), before the softmax (B, nW, H, T, T);
- ``blocks.i.attn``: the window probabilities, float32, (B, nW, H, T, T); ``blocks.i.z``: probabilities
  @ v (B, nW, H, T, d);
- ``pooled``: the mean of the last stage's tokens after the final norm (B, D); ``logits`` (B, C).

Reading is ``keep=`` (names or ``fnmatch`` patterns such as ``"blocks.*.attn"``); changing is
``edit=`` (name or pattern -> ``fn(value, point) -> value``). Neither mutates the model: two
threads with different edits on one cached model never see each other's. How the forward treats
norms, activations and the bilinear products of attention is a :class:`Rules` object, so relevance
propagation can run the same forward with its modified gradients.
"""
from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from ..errors import ViewNotApplicable
from ..layout import TokenLayout

MODEL_POINTS = ("embed", "final_norm", "pooled", "logits")
BLOCK_POINTS = ("resid_pre", "ln1", "q", "k", "v", "scores", "attn", "z", "attn_out", "resid_mid", "ln2",
                "mlp_hidden", "mlp_out", "resid_post")
VIEWS = ("overview", "heads", "rollout", "flow", "distance", "filters", "position", "anatomy", "faithfulness",
         "stats", "attribution", "registers", "readout")


@dataclass(frozen=True)
class Point:
    """Where an edit is applied: ``name`` (e.g. ``"blocks.3.attn"``), ``layer`` (0-based block, None for
    model-level points) and ``kind`` (the name without its block, e.g. ``"attn"``)."""

    name: str
    layer: int | None
    kind: str


def point_name(kind: str, layer: int | None = None) -> str:
    """``point_name("attn", 3)`` -> ``"blocks.3.attn"``; model-level points are their kind."""
    return kind if layer is None else f"blocks.{layer}.{kind}"


def parse_point(name: str) -> Point:
    if name.startswith("blocks."):
        _, layer, kind = name.split(".", 2)
        return Point(name, int(layer), kind)
    return Point(name, None, name)


@dataclass(frozen=True)
class HeadWrite:
    """How one layer's attention heads write into the residual stream, as the block adds them:
    ``attn_out = (z @ weight.T + bias) * scale`` with z the heads' context concatenated (B, N, H * d).

    Head h's own write is its slice ``z[..., h*d:(h+1)*d] @ weight[:, h*d:(h+1)*d].T * scale``; the bias is shared
    by all heads (the direct readout lists it apart).

    Attributes:
        weight: (D, H * d) the output projection's weight.
        bias: (D,) the output projection's bias, or None.
        scale: (D,) the layer scale applied to the branch (LayerScale's gamma), or None.
        heads: H.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: torch.Tensor | None
    heads: int


def branch_scale(fn, width: int, like: torch.Tensor) -> torch.Tensor | None:
    """The per-channel factor (D,) of an element-wise layer scale given as a function or module (None: no scale)."""
    if fn is None or isinstance(fn, torch.nn.Identity):
        return None
    with torch.no_grad():
        return fn(torch.ones(width, dtype=like.dtype, device=like.device))


class Rules:
    """How the forward computes the steps a modified-gradient method changes. The default is the
    model's own arithmetic; every method is the identity of the forward *value*.

    Subclasses (AttnLRP, CP-LRP) change only gradients: the values they return must equal these.
    """

    def norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A LayerNorm / RMSNorm module applied to x."""
        return module(x)

    def act(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """An element-wise activation (GELU, SiLU, ...) applied to x."""
        return fn(x)

    def bilinear(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two operands of a product of two activations (q·kᵀ, attention @ v, a gate)."""
        return a, b

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """The attention softmax, at least float32 (half-precision models still give rows that sum to 1;
        float64 models stay float64, so a float64 reference run is not rounded to float32 here)."""
        return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


PLAIN = Rules()


class Observer:
    """Reads a point's value as the forward reaches it (after its edit), without changing it: what a trace uses to
    keep a kind at every layer. ``slot`` may offer the memory the value is to be computed into."""

    def __call__(self, value: torch.Tensor, point: Point) -> None:
        raise NotImplementedError

    def slot(self, point: Point, shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device) -> torch.Tensor | None:
        """A tensor of ``shape`` and ``dtype`` on ``device`` to compute the point's value into, or None."""
        return None


class _Stop(Exception):
    pass


class Hooks:
    """What one run reads and changes; the spelled-out forward calls ``hooks(name, value)`` at every point.

    Args:
        keep: names or fnmatch patterns of the points to return, or a predicate on the name.
        edit: name or pattern -> ``fn(value, point) -> value``, applied before the value is kept.
        stop_after: end the forward right after this point (the values kept so far are returned).
        rules: how norms, activations, attention products and the softmax are computed.
        fast: allow the library's fused forward where nothing inside the blocks is read or changed (the same
            function, equal to rounding but not bit for bit: for scoring many perturbed inputs).
        observe: (name or pattern, :class:`Observer`) pairs, or a mapping of them: each observer is shown the
            values of its points after their edit (it reads, never changes) and may offer the memory a point is to
            be computed into (:meth:`destination`).
    """

    def __init__(self, keep: Iterable[str] | Callable[[str], bool] = (),
                 edit: Mapping[str, Callable] | None = None, stop_after: str | None = None, rules: Rules = PLAIN,
                 fast: bool = False,
                 observe: Mapping[str, "Observer"] | Iterable[tuple[str, "Observer"]] | None = None):
        self.fast = fast
        self._observe = list(observe.items() if isinstance(observe, Mapping) else observe or ())
        self._observing: dict[str, list[Observer]] = {}
        if callable(keep):
            self._keep = keep
        else:
            names = tuple(keep)
            exact = {n for n in names if not any(c in n for c in "*?[")}
            patterns = [n for n in names if n not in exact]
            self._keep = lambda name: name in exact or any(fnmatch.fnmatchcase(name, p) for p in patterns)
        edit = dict(edit or {})
        self._edit_exact = {k: v for k, v in edit.items() if not any(c in k for c in "*?[")}
        self._edit_patterns = [(k, v) for k, v in edit.items() if k not in self._edit_exact]
        self.stop_after = stop_after
        self.rules = rules
        self.kept: dict[str, torch.Tensor] = {}
        self._wanted: dict[str, bool] = {}

    def wants(self, name: str) -> bool:
        """Whether the value at ``name`` is read or changed: forwards skip work nobody asked for
        (e.g. ``pooled`` and ``logits`` of a model whose caller keeps only attention)."""
        if name not in self._wanted:
            self._wanted[name] = self._keep(name) or self.edits(name) or bool(self._observers(name))
        return self._wanted[name]

    def edits(self, name: str) -> bool:
        """Whether an edit may change the value at ``name`` (observers and keeping do not)."""
        return name in self._edit_exact or any(fnmatch.fnmatchcase(name, p) for p, _ in self._edit_patterns)

    def _observers(self, name: str) -> list["Observer"]:
        if name not in self._observing:
            self._observing[name] = [o for p, o in self._observe if p == name or fnmatch.fnmatchcase(name, p)]
        return self._observing[name]

    def destination(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor | None:
        """Memory an observer of ``name`` offers for the value to be computed into (a layer's slot of a stack it
        keeps), or None. A forward that writes the value there saves the observer a copy; it still calls the
        point."""
        for observer in self._observers(name):
            slot = getattr(observer, "slot", None)
            out = slot(parse_point(name), shape, dtype, device) if slot is not None else None
            if out is not None:
                return out
        return None

    def plain_blocks(self, depth: int) -> bool:
        """Whether the run allows the fast path, no point before ``final_norm`` is read or changed and the
        rules are the model's own: a forward may then run the library's fused path (the same function)."""
        return self.fast and type(self.rules) is Rules and not self.wants("embed") and not any(
            self.wants(point_name(p, i)) for i in range(depth) for p in BLOCK_POINTS)

    def __call__(self, name: str, value: torch.Tensor) -> torch.Tensor:
        fn = self._edit_exact.get(name)
        if fn is None and self._edit_patterns:
            fn = next((f for p, f in self._edit_patterns if fnmatch.fnmatchcase(name, p)), None)
        if fn is not None:
            value = fn(value, parse_point(name))
        if self._keep(name):
            self.kept[name] = value
        if self._observe:
            for observer in self._observers(name):
                observer(value, parse_point(name))
        if name == self.stop_after:
            raise _Stop
        return value


class Adapter:
    """One model family: how it is run and read. Subclasses are registered with
    :func:`vitviz.adapters.register_adapter` and claim built modules with :meth:`claims`.

    Attributes:
        name: registry key (``"timm-vit"``).
        library: ``"timm"``, ``"transformers"``, ...
        scope: ``"global"`` (every token attends to every token: attention (B, L, H, N, N)) or
            ``"window"`` (attention inside local windows per block).
        families: the families it reads, in words.
        hf_model_types: transformers ``model_type`` -> :class:`vitviz.types.HFModelType` for the types
            this adapter reads (the Hugging Face loader accepts exactly the types adapters list).
    """

    name: str = ""
    library: str = ""
    scope: str = "global"
    families: str = ""  # the families it reads, in words (the "not supported yet" sentence names them)
    hf_model_types: dict = {}  # model_type -> HFModelType (transformers adapters only)

    # --- what it claims and how it is laid out -------------------------------------------------
    def claims(self, model: torch.nn.Module) -> bool:
        raise NotImplementedError

    def why_unsupported(self, model: torch.nn.Module) -> str | None:
        """Why a claimed model cannot be read exactly (a sentence fragment), or None."""
        return None

    def label(self, model: torch.nn.Module) -> str:
        """What a reader of the papers calls the family."""
        raise NotImplementedError

    def num_layers(self, model: torch.nn.Module) -> int:
        raise NotImplementedError

    def num_heads(self, model: torch.nn.Module, layer: int = 0) -> int:
        raise NotImplementedError

    def layout(self, model: torch.nn.Module, input_hw: tuple[int, int] | None = None) -> TokenLayout:
        raise NotImplementedError

    def num_classes(self, model: torch.nn.Module) -> int:
        return 0

    def class_labels(self, model: torch.nn.Module) -> tuple[str, ...] | None:
        return None

    # --- the forward ---------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, x: torch.Tensor, hooks: Hooks) -> None:
        """The model's forward, spelled out, calling ``hooks`` at every named point."""
        raise NotImplementedError

    def geometry(self, model: torch.nn.Module, input_hw: tuple[int, int]) -> list:
        """Window families: one :class:`vitviz.adapters.windows.WindowGeometry` per block for an input of
        ``input_hw`` pixels (where each block's windows lie on the image, in the forward's order)."""
        raise NotImplementedError(f"{type(model).__name__} attends globally: it has no windows")

    def readout(self, model: torch.nn.Module, tokens: torch.Tensor, hooks: Hooks) -> None:
        """The model's final norm and head applied to ``tokens`` (B, N, D), a block's output, calling the points
        ``final_norm``, ``pooled`` and ``logits`` (LeGrad reads each layer's tokens through it). A family
        whose head cannot read an intermediate layer's tokens leaves it unimplemented."""
        raise NotImplementedError

    # --- what the views read -------------------------------------------------------------------
    def why_not(self, model: torch.nn.Module, view: str) -> str | None:
        """One sentence saying why ``view`` (one of :data:`VIEWS`) does not apply to this model, or None."""
        return None

    def head_write(self, model: torch.nn.Module, layer: int) -> HeadWrite | None:
        """How layer ``layer``'s heads write into the residual stream (:class:`HeadWrite`), or None where the
        attention branch is not affine in the heads' context (a norm or a gate after the heads, post-norm blocks) or
        the family does not say yet: the direct readout (:mod:`vitviz.residual`) then refuses with a sentence."""
        return None

    def why_not_attribution(self, model: torch.nn.Module, method: str) -> str | None:
        """One sentence saying why the attribution ``method`` (a :class:`vitviz.explainers.base.AttributionMethod`) does not
        apply to this model where the attribution view does, or None."""
        return None

    def why_no_extra_token(self, model: torch.nn.Module) -> str | None:
        """Why a token inserted at ``embed`` after the prefix tokens (a test-time register) would not run
        through this family's forward as one more prefix token, as a sentence fragment; None when it does."""
        return f"the {self.label(model)} forward does not take an extra token yet"

    def position_encoding(self, model: torch.nn.Module) -> str:
        return "none"

    def position_table(self, model: torch.nn.Module):
        """The learned absolute position table as stored, (1, rows, D), or None."""
        return None

    def native_pos_embed(self, model: torch.nn.Module, layout: TokenLayout):
        """The position table as the model runs it (:class:`vitviz.types.NativePosEmbed`), or None."""
        from ..types import NativePosEmbed

        table = self.position_table(model)
        return None if table is None else NativePosEmbed.from_weights(table, layout.pos_embed_prefix_rows,
                                                                       layout.grid_size)

    def patch_filters(self, model: torch.nn.Module) -> torch.Tensor:
        """The linear RGB patch-embedding filters (D, 3, P, P)."""
        raise ViewNotApplicable(f"{type(model).__name__} has no linear RGB patch filters.")

    def attention_steps(self, model: torch.nn.Module, layer: int) -> list[str]:
        """The layer's steps from its input to the scores, in words (the anatomy page)."""
        return []

    def layer_qkv(self, model: torch.nn.Module, x: torch.Tensor, layer: int):
        """q, k, v (each (B, H, N, d)) of layer ``layer`` (0-based) as the dot product sees them, the scale,
        the layer's steps in words and the bias added to the scaled scores ((1, H, N, N) or None):
        softmax(q kᵀ · scale + bias) is the ``attn`` point. Returns (q, k, v, scale, steps, bias)."""
        raise NotImplementedError

    def pooled_text(self, model: torch.nn.Module) -> str:
        """What ``pooled`` is, in words."""
        return "the pooled vector the head reads"

    def card(self, model: torch.nn.Module) -> dict:
        return {}

    def architecture(self, model: torch.nn.Module):
        """What fixes the size of one image's attention (:class:`vitviz.types.Architecture`), read from the
        model's structure: built on the meta device it costs no memory. Window families override it."""
        from ..types import Architecture

        layout = self.layout(model)
        gh, gw = layout.grid_size
        ph, pw = layout.patch_size
        return Architecture(depth=self.num_layers(model), heads=self.num_heads(model), patch=(ph, pw),
                            prefix_tokens=layout.num_prefix_tokens, default_size=gh * ph)

    def config_architecture(self, config):
        """The same from a transformers config alone, before the model is built (the memory budget), for the
        types in :attr:`hf_model_types`; None: the budget reads the usual ViT config fields."""
        return None


def compose_edits(*edits: Mapping[str, Callable] | None) -> dict[str, Callable]:
    """One ``edit=`` mapping that applies, at every point, each given mapping's edit in turn (first to last).

    A :class:`Hooks` run applies one function per point; two readers or changers of the same point (a
    a trace reading ``blocks.*.attn`` and a repair masking it) are composed here instead. Keys stay as
    given (names or patterns), so a run still skips the points nobody asked for.
    """
    given = [dict(e) for e in edits if e]

    def apply(value, point: Point):
        for mapping in given:
            fn = mapping.get(point.name)
            if fn is None:
                fn = next((f for p, f in mapping.items() if fnmatch.fnmatchcase(point.name, p)), None)
            if fn is not None:
                value = fn(value, point)
        return value

    return {key: apply for mapping in given for key in mapping}


_CONTEXT_EDIT: ContextVar[dict | None] = ContextVar("vitviz_context_edit", default=None)


@contextmanager
def editing(edit: Mapping[str, Callable] | None):
    """Every :func:`run` inside this block (in this thread) applies ``edit`` first, before its own ``edit=``.

    For analyses that run the model themselves and take no ``edit=`` (attribution): a repair
    (:mod:`vitviz.analyses.registers`) then changes their forward the same way it changes a trace's. Context-local,
    so two threads with different edits on one cached model never see each other's."""
    token = _CONTEXT_EDIT.set(compose_edits(_CONTEXT_EDIT.get(), edit) or None)
    try:
        yield
    finally:
        _CONTEXT_EDIT.reset(token)


def run(adapter: Adapter, model: torch.nn.Module, x: torch.Tensor, keep=(), edit=None, stop_after=None,
        rules: Rules = PLAIN, fast: bool = False, observe=None) -> dict[str, torch.Tensor]:
    """Run ``adapter``'s forward of ``model`` on ``x`` (B, 3, H, W): the kept points by name (the edit of an
    enclosing :func:`editing` applied first; ``observe``: :class:`Hooks`)."""
    context = _CONTEXT_EDIT.get()
    if context:
        edit = compose_edits(context, edit)
    hooks = Hooks(keep, edit, stop_after, rules, fast, observe)
    try:
        adapter.forward(model, x, hooks)
    except _Stop:
        pass
    return hooks.kept
