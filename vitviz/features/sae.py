"""A TopK sparse autoencoder (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"), trained here.

    z     = ReLU(TopK(W_enc (s·x − b_dec) + b_enc))          (…, K), at most k non-zero per token
    x̂     = (W_dec z + b_dec) / s                             (…, D)

``W_enc`` (K, D), ``W_dec`` (K, D) whose rows are the latents' unit-norm directions (:attr:`SAE.decoder`), ``b_dec``
(D) initialised at the data mean (the paper's geometric median, the mean here: one pass cheaper, and the same
on activations without heavy outliers), ``W_enc`` initialised at ``W_dec`` (tied init, as in the paper). ``s`` is
one scalar, s = sqrt(D / E‖x − μ‖²), so that the SAE sees centred tokens of mean squared norm D whatever the
layer's scale (saev's normalisation, centred): learning rates carry over between layers and models.

**Dead latents** are handled by the paper's auxiliary-k loss: a latent that fired on none of the last
``dead_after`` tokens is dead; the k_aux = min(D / 2, dead) dead latents with the largest pre-activations
reconstruct the residual e = s·x − ŝx̂ (held constant), and L_aux = ‖e − ê‖² / ‖e‖² is added with weight 1/32.
The main loss is the normalised MSE ‖s·x − s·x̂‖² / ‖s·x − s·μ_batch‖² (both summed over the batch).
After every Adam step the decoder rows are put back on the unit sphere; before it the gradient's component
parallel to each row is removed (the paper's "project out" step), so Adam moves along the sphere. Training decodes
sparsely (the k chosen rows of W_dec summed, ``embedding_bag``; the paper's sparse decoder), not as a dense (b, K)
product.

**Why a small torch module and not a library.** ``overcomplete`` 0.3.0 (TopK, BatchTopK, JumpReLU, archetypal
SAEs in torch) installs beside the pinned stack, but it brings opencv-python, scikit-image, imageio and tifffile
(~100 MB) for one ~200-line module, and its training loop keeps no resumable state (optimiser, data position,
dead-latent counters), which a killed ``features train`` run needs to continue to the same weights. The arithmetic
above is short enough to own and to test against planted dictionaries (tests/test_features_sae.py); the training
itself is :mod:`vitviz.features.trainer`.

**How long.** Given no ``epochs``, :meth:`SAE.fit` trains until it has converged on the data it was given: at least
one pass and :attr:`Convergence.min_steps` steps (a small set is repeated over), then until the mean training
explained variance of the last ``window`` steps gains less than ``tol`` on the ``window`` before (a plateau), or the
step budget ends. ``info["training"]`` says which (``stop_reason``: ``"plateau"`` or ``"budget"``) with the final
explained variance, and a run that stopped on its budget (``max_steps``, the ``epochs`` asked for, the end of a
one-shot stream) while the explained variance was still rising says so: a :class:`NotConvergedWarning` and the same
sentence in ``info["training"]["warning"]`` (sae.json).

Determinism: with the same ``seed`` and data the weights are the same bit for bit (CPU); nothing random is
drawn after initialisation except the epoch's permutation, which is a function of (seed, epoch). A run killed
after any step and resumed from its checkpoint ends where the uninterrupted run ends.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..io.atomic import atomic_write_bytes
from .trainer import (AUX_COEF, Convergence, NotConvergedWarning, SAEError, Trainer, bar_postfix, run_epochs,
                      stop_record)

__all__ = ["SAE", "Trainer", "Convergence", "NotConvergedWarning", "evaluate", "SAE_WEIGHTS", "SAE_INFO", "FORMAT"]

SAE_WEIGHTS, SAE_INFO = "sae.safetensors", "sae.json"
FORMAT = "vitviz-sae/1"
ACTIVATIONS = ("topk_relu", "topk", "relu")


class SAE(torch.nn.Module):
    """A TopK SAE over D-dimensional tokens with K latents, k active per token (see the module docstring).

    Args:
        d_model: D, the width of the tokens it reads.
        latents: K, the number of latents (dictionary size).
        topk: k, latents kept per token (1 <= k <= K); None for ``activation="relu"``.
        scale: s, the scalar the tokens are multiplied by before encoding (and divided by after decoding).
        info: what the SAE was trained on (model, point, layer, images, metrics; written to sae.json).
        activation: ``"topk_relu"`` (Gao et al., ViT-Prisma: ReLU of the top k), ``"topk"`` (saev's TopK: the top k
            pre-activations as they are, negative ones too) or ``"relu"`` (an L1-trained SAE: every positive one).
        centre_input: subtract b_dec before encoding (Gao et al., ViT-Prisma); saev's encoder reads x as it is.

    Only ``topk_relu`` SAEs are trained here; the other two are the public SAEs :func:`vitviz.features.load_sae`
    reads.
    """

    def __init__(self, d_model: int, latents: int, topk: int | None, scale: float = 1.0, info: dict | None = None,
                 activation: str = "topk_relu", centre_input: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise SAEError(f"unknown SAE activation {activation!r}: one of {', '.join(ACTIVATIONS)}.")
        if activation != "relu" and not (topk is not None and 1 <= topk <= latents):
            raise SAEError(f"topk must be between 1 and the number of latents ({latents}), not {topk}.")
        self.d_model, self.latents = int(d_model), int(latents)
        self.topk = None if activation == "relu" else int(topk)
        self.activation, self.centre_input = activation, bool(centre_input)
        self.W_enc = torch.nn.Parameter(torch.zeros(latents, d_model))
        self.b_enc = torch.nn.Parameter(torch.zeros(latents))
        self.W_dec = torch.nn.Parameter(torch.zeros(latents, d_model))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_model))
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.info = dict(info or {})

    # --- the maps --------------------------------------------------------------------------------
    @property
    def decoder(self) -> torch.Tensor:
        """(K, D) the latents' directions in the tokens' space, unit rows (a detached view)."""
        return self.W_dec.detach()

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """(…, D) tokens -> (…, K) encoder outputs before the activation."""
        xs = x * self.scale
        return ((xs - self.b_dec) if self.centre_input else xs) @ self.W_enc.T + self.b_enc

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(…, D) tokens -> (…, K) latent activations in normalised units: at most k non-zero per token, >= 0 (``topk``
        SAEs may keep negative ones; see ``activation``)."""
        pre = self.pre_activations(x)
        if self.activation == "relu":
            return pre.relu()
        if self.activation == "topk":
            values, index = pre.topk(self.topk, dim=-1)
            return torch.zeros_like(pre).scatter(-1, index, values)
        return _topk_relu(pre, self.topk)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """(…, K) latent activations -> (…, D) tokens in the input's units."""
        return (z @ self.W_dec + self.b_dec) / self.scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(…, D) -> (x̂ (…, D), z (…, K))."""
        z = self.encode(x)
        return self.decode(z), z

    # --- building ----------------------------------------------------------------------------------
    @torch.no_grad()
    def init_from(self, sample: torch.Tensor, seed: int) -> "SAE":
        """Data-dependent initialisation from ``sample`` (n, D): b_dec at its mean (scaled), s from its spread,
        decoder rows uniform on the sphere (a generator seeded with ``seed``), W_enc = W_dec."""
        sample = sample.to(torch.float64)
        mean = sample.mean(0)
        spread = (sample - mean).pow(2).sum(-1).mean()
        scale = math.sqrt(self.d_model / float(spread)) if float(spread) > 0 else 1.0
        self.scale.fill_(scale)
        self.b_dec.copy_((mean * scale).to(self.b_dec.dtype))
        gen = torch.Generator().manual_seed(int(seed))
        w = torch.randn(self.latents, self.d_model, generator=gen, dtype=torch.float64)
        w /= w.norm(dim=-1, keepdim=True)
        self.W_dec.copy_(w.to(self.W_dec.dtype))
        self.W_enc.copy_(w.to(self.W_enc.dtype))
        self.b_enc.zero_()
        return self

    @classmethod
    def fit(cls, activations, latents: int, topk: int, seed: int = 0, epochs: int | None = None,
            batch_size: int = 256, lr: float | None = None, dead_after: int | None = None,
            checkpoint: str | Path | None = None, checkpoint_every: int = 100,
            callback: Callable[[int, dict], None] | None = None, progress: bool = False, info: dict | None = None,
            device: str | torch.device = "cpu", until: Convergence | None = None) -> "SAE":
        """Train a TopK SAE on tokens.

        Args:
            activations: (n, D) array or tensor (shuffled each epoch by a permutation of (seed, epoch), cut into
                ``batch_size`` rows), or an iterable of (b, D) batches taken in its order (a one-shot iterator gives
                one epoch; initialisation reads its first batch).
            latents: K. topk: k.
            seed: decides the initialisation and the order; same seed and data -> same weights.
            epochs: passes over ``activations``; None (default): until converged (``until``; the module docstring's
                "How long").
            until: the plateau test and step budget used when ``epochs`` is None; default :class:`Convergence`().
            lr: Adam's learning rate; default the paper's 2e-4 / sqrt(K / 2^14).
            dead_after: tokens without firing after which a latent counts as dead (auxiliary-k loss); default 16
                batches' worth (the paper's 10 M tokens are ~76 of its 131 k-token batches; small data sets need the
                count in batches, not in tokens, to see a latent die at all).
            checkpoint: a file that holds the training state every ``checkpoint_every`` steps and at the end; if it
                exists the run continues from it (same data and settings give the uninterrupted run's weights).
            callback: ``fn(step, metrics)`` after every step (1-based steps).
            progress: a tqdm bar with the last batch's NMSE, explained variance, L0 and dead fraction.
            device: where the SAE trains: ``"cpu"`` (default), ``"cuda"``, ``"cuda:1"``, ``"mps"`` or ``"auto"``; each
                batch moves there (the initialisation is computed in float64 on the CPU, the same on every device).

        Returns:
            the trained SAE (eval mode, on ``device``) with ``info["training"]`` (steps, tokens, epochs, seed, lr, and
            why it stopped: ``stop_reason``, ``explained_variance``, ``still_rising``, ``warning``) and
            ``info["metrics"]`` (the last step's training metrics).

        Warns:
            NotConvergedWarning: it stopped on its budget while the explained variance was still rising.
        """
        until = Convergence() if until is None else until
        until.check()
        if epochs is not None and epochs < 1:
            raise SAEError(f"epochs must be 1 or more, not {epochs}.")
        data = _Batches.of(activations, seed, batch_size, epochs)
        from ..sources.models import resolve_device

        sae = cls(data.first.shape[-1], latents, topk, info=info).init_from(data.first, seed)
        sae = sae.to(resolve_device(str(device)))
        trainer = Trainer(sae, lr=lr, dead_after=16 * batch_size if dead_after is None else dead_after,
                          window=until.window)
        trainer.settings["seed"] = int(seed)
        if epochs is None:
            trainer.settings["until"] = asdict(until)
        path = Path(checkpoint) if checkpoint else None
        if path is not None and path.exists():
            trainer.load_checkpoint(path)
        bar = None
        if progress:
            from tqdm import tqdm
            total = None if data.n_batches is None else data.n_batches * epochs if epochs else None
            bar = tqdm(total=total, initial=trainer.step_count, unit="step", desc="SAE")

        def on_step(metrics: dict) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(bar_postfix(metrics), refresh=False)
            if callback is not None:
                callback(trainer.step_count, metrics)

        run_epochs(trainer, data.batches, epochs, until, data.one_shot, path, checkpoint_every, on_step)
        if bar is not None:
            bar.close()
        budget = (f"epochs={epochs}" if epochs else "the one-shot iterator's batches" if data.one_shot and
                  trainer.step_count < until.max_steps else f"max_steps={until.max_steps}")
        sae.info["training"] = {**trainer.settings, "steps": trainer.step_count, "tokens": trainer.tokens,
                                "epochs": (round(trainer.tokens / data.rows, 3) if data.rows is not None else
                                           trainer.epoch + (trainer.batch > 0)),
                                "batch_size": batch_size,
                                **stop_record(trainer.history, trainer.stopped, budget, until.tol)}
        sae.info["metrics"] = trainer.last
        return sae.eval()

    # --- files -----------------------------------------------------------------------------------
    def save(self, folder: str | Path, extra: dict | None = None) -> Path:
        """Write ``sae.safetensors`` (W_enc (K, D), b_enc (K), W_dec (K, D), b_dec (D), float32) and ``sae.json``
        (D, K, k, the normalisation, :attr:`info` and ``extra``) into ``folder``, each file whole or not at all."""
        from safetensors.torch import save

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.named_parameters()}
        atomic_write_bytes(folder / SAE_WEIGHTS, save(tensors))
        atomic_write_bytes(folder / SAE_INFO, (json.dumps(self.describe() | (extra or {}), indent=2) + "\n").encode())
        return folder

    def describe(self) -> dict:
        """sae.json's content: what the weights are and what they were trained on."""
        return {"format": FORMAT, "activation": self.activation, "centre_input": self.centre_input,
                "d_model": self.d_model, "latents": self.latents, "topk": self.topk,
                "normalisation": {"kind": "scalar", "scale": float(self.scale),
                                  "definition": "the SAE reads s*x; s = sqrt(D / E||x - mean||^2) over the "
                                                "training tokens; activations are in these units"},
                "definitions": {"encode": {"topk_relu": "z = ReLU(TopK(W_enc (s x - b_dec) + b_enc))",
                                           "topk": "z = TopK(W_enc (s x - b_dec) + b_enc)",
                                           "relu": "z = ReLU(W_enc (s x - b_dec) + b_enc)"}[self.activation]
                                + ("" if self.centre_input else " with no b_dec subtracted before W_enc"),
                                "decode": "x_hat = (W_dec^T z + b_dec) / s; W_dec rows (K, D) unit norm"},
                **self.info}

    @classmethod
    def load(cls, folder: str | Path) -> "SAE":
        """An SAE written by :meth:`save` (or ``features train``); the public formats: :func:`vitviz.features.load_sae`.

        Raises:
            SAEError: the folder holds no vitviz SAE, or its files disagree (the sentence names the file).
        """
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            info = json.loads((folder / SAE_INFO).read_text())
        except (OSError, ValueError) as exc:
            raise SAEError(f"{folder / SAE_INFO}: not readable as an SAE description ({exc}).") from exc
        if info.get("format") != FORMAT:
            raise SAEError(f"{folder / SAE_INFO}: format {info.get('format')!r} is not {FORMAT!r}.")
        try:
            tensors = load_file(str(folder / SAE_WEIGHTS))
        except Exception as exc:  # safetensors raises its own error types for broken files
            raise SAEError(f"{folder / SAE_WEIGHTS}: not readable as safetensors ({exc}).") from exc
        meta = {k: info.pop(k) for k in ("format", "activation", "centre_input", "d_model", "latents", "topk",
                                         "normalisation", "definitions")}
        sae = cls(meta["d_model"], meta["latents"], meta["topk"], meta["normalisation"]["scale"], info,
                  meta["activation"], meta["centre_input"])
        sae.load_tensors(tensors, folder / SAE_WEIGHTS)
        return sae.eval()

    def load_tensors(self, tensors: dict[str, torch.Tensor], where) -> None:
        """Copy W_enc, b_enc, W_dec, b_dec in; shapes checked (``where`` names the file in the sentence)."""
        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise SAEError(f"{where}: missing {', '.join(missing)}.")
        with torch.no_grad():
            for name, param in own.items():
                if tuple(tensors[name].shape) != tuple(param.shape):
                    raise SAEError(f"{where}: {name} has shape {tuple(tensors[name].shape)}, expected "
                                   f"{tuple(param.shape)}.")
                param.copy_(tensors[name])


def _topk_relu(pre: torch.Tensor, k: int) -> torch.Tensor:
    values, index = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, index, values.relu())


@dataclass(frozen=True)
class _Batches:
    """What :meth:`SAE.fit` reads: ``batches(epoch)`` yields (b, D) float32 batches; ``first`` initialises the SAE;
    ``rows`` and ``n_batches`` are known for an array (None for an iterable); a ``one_shot`` iterator is one epoch."""

    first: torch.Tensor
    batches: Callable
    rows: int | None = None
    n_batches: int | None = None
    one_shot: bool = False

    @classmethod
    def of(cls, activations, seed: int, batch_size: int, epochs: int | None) -> "_Batches":
        """An (n, D) array shuffled each epoch by a permutation of (seed, epoch), or an iterable taken in its order."""
        array = _as_array(activations)
        if array is not None:
            def shuffled(epoch):
                order = np.random.default_rng([int(seed), epoch]).permutation(len(array))
                for s in range(0, len(array), batch_size):
                    yield array[torch.from_numpy(order[s:s + batch_size])]

            return cls(array, shuffled, len(array), math.ceil(len(array) / batch_size))
        iterable = activations
        one_shot = iter(iterable) is iterable
        if one_shot and epochs not in (None, 1):
            raise SAEError("a one-shot iterator of batches is one epoch: give a list of batches (or an array) "
                           "for more epochs.")
        stream = iter(iterable)
        first = _float32(next(stream))

        def in_order(epoch):
            if epoch == 0:
                yield first
                yield from (_float32(b) for b in stream)
            else:
                yield from (_float32(b) for b in iterable)

        return cls(first, in_order, one_shot=one_shot)


def _float32(batch) -> torch.Tensor:
    return torch.as_tensor(np.asarray(batch), dtype=torch.float32)


def _as_array(activations) -> torch.Tensor | None:
    if isinstance(activations, torch.Tensor):
        return activations.detach().to("cpu", torch.float32)
    if isinstance(activations, np.ndarray):
        if activations.ndim != 2:
            raise SAEError(f"activations must be (n, D), not {activations.shape}.")
        return torch.from_numpy(np.ascontiguousarray(activations, dtype=np.float32))
    return None


@torch.no_grad()
def evaluate(sae: SAE, activations, batch_size: int = 4096) -> dict:
    """How well ``sae`` reconstructs tokens (n, D) (array, tensor, or an iterable of batches).

    Returns:
        dict: ``nmse`` = Σ‖x − x̂‖² / Σ‖x − mean(x)‖² (over all tokens), ``explained_variance`` = 1 − nmse, ``l0`` =
        mean non-zero latents per token, ``dead_fraction`` = share of the K latents that fire on none of the tokens,
        ``tokens`` = n; ``frequency`` (K,) = share of tokens on which each latent fires.
    """
    array = _as_array(activations)
    batches = (array[s:s + batch_size] for s in range(0, len(array), batch_size)) if array is not None else (
        torch.as_tensor(np.asarray(b), dtype=torch.float32) for b in activations)
    err, n, l0 = 0.0, 0, 0.0
    total = total_sq = None
    fires = torch.zeros(sae.latents, dtype=torch.float64)
    for x in batches:
        x = x.to(sae.W_dec.device, torch.float32)
        x_hat, z = sae(x)
        err += float((x - x_hat).double().pow(2).sum())
        xd = x.double()
        total = xd.sum(0) if total is None else total + xd.sum(0)
        total_sq = xd.pow(2).sum() if total_sq is None else total_sq + xd.pow(2).sum()
        active = (z > 0)
        l0 += float(active.sum())
        fires += active.sum(0).double().cpu()
        n += len(x)
    if n == 0:
        raise SAEError("no tokens to evaluate the SAE on.")
    var = float(total_sq - total.pow(2).sum() / n)
    nmse = err / var
    return {"nmse": nmse, "explained_variance": 1 - nmse, "l0": l0 / n, "dead_fraction": float((fires == 0).double().mean()),
            "tokens": n, "frequency": (fires / n).numpy()}
