"""The logit lens: the model's own readout (final norm, pooling, head) applied after every block.

``logit_lens(lens, x)`` reads the residual stream after each block l as if it were the last: the family's readout
(:meth:`vitviz.adapters.Adapter.readout`) on ``resid_post`` of block l gives (B, L, C) logits, the last equal to the
model's logits bit for bit (the same operations on the same tensor). Per patch (``per_patch=True``) each token is
read alone: the readout of a sequence in which every token is that token, so a CLS-pooled head reads it through the
final norm and the head, a mean-pooled head the same (the mean of equal tokens) — (B, L, N, C), which classes each
patch "says" at each depth.

A :class:`TunedLens` (Belrose et al. 2023) first maps block l's tokens by an affine map fitted to the last block's
tokens on the user's images. Belrose et al. fit each translator by gradient descent on the KL divergence to the final
logits; here each map is the ridge least-squares fit of the last block's tokens on block l's (closed form, float64),
and its held-out fit is reported beside the plain lens's, so a user sees what the fitting bought.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..adapters import Hooks
from ..errors import GIVE_A_HEAD
from .direct import check_trace
from .frozen import ReadoutNotApplicable


def why_not(lens, give_head: str = GIVE_A_HEAD) -> str | None:
    """Why the logit lens does not apply to ``lens``'s model (no classes to read, window attention), or None.
    ``give_head``: how the reader gives a headless model classes, in the reader's words."""
    if lens.scope != "global":
        return lens.loaded.why_not("readout")
    if not lens.has_head:
        return (f"{lens.label} has no classifier head, so there are no classes to read the layers in: open it with a "
                f"head ({give_head}).")
    return None


def _read(lens, tokens: torch.Tensor) -> torch.Tensor:
    """The model's readout of tokens (B, N, D) -> logits (B, C), through the family's own final norm and head."""
    hooks = Hooks(keep=("logits",))
    lens.adapter.readout(lens.model, tokens, hooks)
    return hooks.kept["logits"]


def _read_each_token(lens, tokens: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """(B, N, D) -> (B, N, C): every token read as if the whole sequence were that token."""
    B, N, D = tokens.shape
    width = lens.layout.num_prefix_tokens + 1  # a prefix slot and one patch: every pooling reads some of them
    flat = tokens.reshape(B * N, 1, D)
    out = [_read(lens, flat[i:i + chunk].expand(-1, width, -1)) for i in range(0, B * N, chunk)]
    return torch.cat(out).reshape(B, N, -1)


@dataclass
class LogitLens:
    """The head's reading of the residual stream after every block.

    Attributes:
        logits: (B, L, C) the logits read after each block (0-based layers; the last equals the model's logits).
        patches: (B, L, N, C) each token read alone (``per_patch=True``), or None.
        labels: the C class names, or None.
        images: the images' names, in batch order.
        tuned: whether a :class:`TunedLens` mapped each block first.
    """

    logits: np.ndarray
    patches: np.ndarray | None = None
    labels: tuple[str, ...] | None = None
    images: list[str] = field(default_factory=list)
    tuned: bool = False

    def probabilities(self) -> np.ndarray:
        """(B, L, C) the softmax over the classes of each layer's logits."""
        z = self.logits.astype(np.float64)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def of(self, image: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(L, C) probabilities and logits after every block for image ``image``, or their means over the images
        (None)."""
        probs = self.probabilities()
        if image is None:
            return probs.mean(0), self.logits.mean(0)
        return probs[image], self.logits[image]

    def patch_probabilities(self, layer: int, cls: int, layout, image: int = 0) -> np.ndarray:
        """(1, gh, gw) the probability each patch's token gives class ``cls`` at block ``layer`` (0-based), read
        alone (``per_patch=True``); prefix tokens left out."""
        if self.patches is None:
            raise ValueError("this logit lens was read without per_patch=True")
        z = self.patches[image, layer].astype(np.float64)  # (N, C)
        e = np.exp(z - z.max(-1, keepdims=True))
        probs = e[:, cls] / e.sum(-1)
        return probs[layout.num_prefix_tokens:].reshape(1, *layout.grid_size)

    def label(self, c: int) -> str:
        return self.labels[c] if self.labels and c < len(self.labels) else f"class {c}"

    def table(self, top: int = 5) -> pd.DataFrame:
        """Per image and layer: the ``top`` classes at that layer and the model's final top-1 class, as rows of
        ``image`` (0-based), ``name``, ``layer`` (0-based), ``class``, ``label``, ``logit``, ``prob`` (softmax over
        the C classes at that layer) and ``rank`` (1 = the layer's top class)."""
        B, L, C = self.logits.shape
        rows = []
        for b in range(B):
            name = self.images[b] if b < len(self.images) else f"image {b + 1}"
            final = int(self.logits[b, -1].argmax())
            for l in range(L):
                row = self.logits[b, l].astype(np.float64)
                order = np.argsort(-row, kind="stable")
                ranks = np.empty(C, dtype=int)
                ranks[order] = np.arange(1, C + 1)
                prob = np.exp(row - row.max())
                prob /= prob.sum()
                for c in dict.fromkeys([*order[:top].tolist(), final]):
                    rows.append((b, name, l, int(c), self.label(int(c)), float(row[c]), float(prob[c]), int(ranks[c])))
        return pd.DataFrame(rows, columns=["image", "name", "layer", "class", "label", "logit", "prob", "rank"])


def logit_lens(lens, x, per_patch: bool = False, tuned: "TunedLens | None" = None, trace=None) -> LogitLens:
    """The model's head read after every block.

    Args:
        lens: a :class:`vitviz.Lens` with a classifier head (timm / Hugging Face heads, or a probe head).
        x: images as :meth:`vitviz.Lens.trace` takes them.
        per_patch: also read every token alone, (B, L, N, C).
        tuned: a fitted :class:`TunedLens`: each block's tokens go through its map first.
        trace: a :class:`vitviz.Trace` of ``x`` already run that kept ``"resid_post"`` at every block; without it
            the lens runs its own forward.

    Returns:
        LogitLens: ``logits`` (B, L, C) and, on request, ``patches`` (B, L, N, C).

    Raises:
        ReadoutNotApplicable: a model without a head or with window attention (the sentence says what to do).
    """
    why = why_not(lens)
    if why:
        raise ReadoutNotApplicable(why)
    inputs = lens.as_input(x)
    trace = trace if trace is not None else lens.trace(inputs, keep=["resid_post"])
    check_trace(trace, inputs, ("resid_post", 0))
    logits, patches = [], []
    with torch.no_grad():
        for l in range(lens.num_layers):
            tokens = trace["resid_post", l]
            if tuned is not None:
                tokens = tuned.apply(tokens, l)
            logits.append(_read(lens, tokens).float().cpu())
            if per_patch:
                patches.append(_read_each_token(lens, tokens).float().cpu())
    return LogitLens(torch.stack(logits, 1).numpy(), torch.stack(patches, 1).numpy() if per_patch else None,
                     lens.class_labels, [s.name for s in (inputs.sources or [])], tuned is not None)


def _kl(final: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(softmax(final) || softmax(other)) per row, nats."""
    p = final.log_softmax(-1)
    return (p.exp() * (p - other.log_softmax(-1))).sum(-1)


@dataclass
class TunedLens:
    """One affine map per block, fitted to the last block's tokens: ``tokens_l @ weight[l] + bias[l]``.

    Attributes:
        weight: (L, D, D) float64; the last block's is the identity.
        bias: (L, D) float64.
        fit: per layer (0-based) on the held-out images: ``kl_plain`` and ``kl_tuned`` (mean KL divergence in nats
            from the model's final distribution to the plain and the tuned lens's), ``top1_plain`` and ``top1_tuned``
            (share of held-out images whose top-1 class the lens already gives), ``images_fit``, ``images_held_out``.
        ridge: the ridge penalty, relative to the mean squared token entry.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    fit: pd.DataFrame
    ridge: float

    def apply(self, tokens: torch.Tensor, layer: int) -> torch.Tensor:
        """Block ``layer``'s tokens (B, N, D) mapped toward the last block's, in the tokens' dtype."""
        w, b = self.weight[layer].to(tokens.device), self.bias[layer].to(tokens.device)
        return (tokens.double() @ w + b).to(tokens.dtype)

    @classmethod
    def fit_images(cls, lens, x, held_out: float = 0.25, ridge: float = 1e-3, seed: int = 0,
                   batch_size: int = 16) -> "TunedLens":
        """Fit every block's map on a share of the images and score it on the rest.

        Args:
            lens: a :class:`vitviz.Lens` with a classifier head.
            x: the image set (as :meth:`vitviz.Lens.preprocess` takes them, or a :class:`ModelInput`); at least 2.
            held_out: the share of images kept out of the fit (at least one image).
            ridge: the ridge penalty λ relative to the mean squared token entry (λ·mean(x²)·n on the diagonal).
            seed: which images are held out.
            batch_size: images per forward.
        """
        why = why_not(lens)
        if why:
            raise ReadoutNotApplicable(why)
        inputs = lens.as_input(x)
        B = inputs.tensor.shape[0]
        if B < 2:
            raise ReadoutNotApplicable("a tuned lens needs at least 2 images: one to fit its maps, one to check them.")
        order = np.random.default_rng(seed).permutation(B)
        n_out = min(B - 1, max(1, int(round(held_out * B))))
        test, train = order[:n_out], order[n_out:]
        L = lens.num_layers
        xtx = ytx = None
        squares, entries, D = 0.0, 0, None
        for start in range(0, len(train), batch_size):
            idx = torch.as_tensor(np.sort(train[start:start + batch_size]))
            trace = lens.trace(inputs.tensor[idx], keep=["resid_post"])
            final = trace["resid_post", L - 1].double().flatten(0, 1).cpu()
            D = final.shape[1]
            ones = torch.ones(final.shape[0], 1, dtype=torch.float64)
            feats = [torch.cat([trace["resid_post", l].double().flatten(0, 1).cpu(), ones], 1) for l in range(L - 1)]
            if xtx is None:
                xtx, ytx = [f.T @ f for f in feats], [f.T @ final for f in feats]
            else:
                for l, f in enumerate(feats):
                    xtx[l] += f.T @ f
                    ytx[l] += f.T @ final
            squares += float(sum((f[:, :-1] ** 2).sum() for f in feats))
            entries += sum(f[:, :-1].numel() for f in feats)
        weight = torch.eye(D, dtype=torch.float64).repeat(L, 1, 1)
        bias = torch.zeros(L, D, dtype=torch.float64)
        tokens = entries // max(1, D * (L - 1))  # the fit's samples per layer
        penalty = ridge * (squares / max(1, entries)) * tokens
        for l in range(L - 1):
            reg = torch.eye(D + 1, dtype=torch.float64) * penalty
            reg[-1, -1] = 0  # the bias is not penalised
            solution = torch.linalg.solve(xtx[l] + reg, ytx[l])
            weight[l], bias[l] = solution[:-1], solution[-1]
        tuned = cls(weight, bias, pd.DataFrame(), ridge)
        tuned.fit = tuned._score(lens, inputs.tensor[torch.as_tensor(np.sort(test))], len(train))
        return tuned

    def _score(self, lens, x: torch.Tensor, images_fit: int) -> pd.DataFrame:
        trace = lens.trace(x, keep=["resid_post"])
        L = lens.num_layers
        with torch.no_grad():
            final = _read(lens, trace["resid_post", L - 1]).double()
            top = final.argmax(-1)
            rows = []
            for l in range(L):
                plain = _read(lens, trace["resid_post", l]).double()
                tuned = _read(lens, self.apply(trace["resid_post", l], l)).double()
                rows.append((l, float(_kl(final, plain).mean()), float(_kl(final, tuned).mean()),
                             float((plain.argmax(-1) == top).double().mean()),
                             float((tuned.argmax(-1) == top).double().mean()), images_fit, x.shape[0]))
        return pd.DataFrame(rows, columns=["layer", "kl_plain", "kl_tuned", "top1_plain", "top1_tuned", "images_fit",
                                           "images_held_out"])
