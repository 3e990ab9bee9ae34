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
SAEs in torch) installs cleanly beside the pinned stack (``pip install --dry-run``, 2026-11-27), but it brings
opencv-python, scikit-image, imageio and tifffile (~100 MB) for one ~200-line module, and its training loop
keeps no resumable state (optimiser, data position, dead-latent counters), which a killed ``features train`` run
needs to continue to the same weights. The arithmetic above is short enough to own and to test against
planted dictionaries (tests/test_features_sae.py).

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

import io
import itertools
import json
import math
import warnings
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import VitvizError
from ..io.atomic import atomic_write_bytes

__all__ = ["SAE", "Trainer", "Convergence", "NotConvergedWarning", "evaluate", "SAE_WEIGHTS", "SAE_INFO", "FORMAT"]

SAE_WEIGHTS, SAE_INFO = "sae.safetensors", "sae.json"
FORMAT = "vitviz-sae/1"
AUX_COEF = 1 / 32  # the paper's alpha for the auxiliary-k loss
ACTIVATIONS = ("topk_relu", "topk", "relu")


class SAEError(VitvizError):
    """An SAE file or setting that cannot be used (the sentence names it and says why)."""


class NotConvergedWarning(UserWarning):
    """Training stopped on its budget while the explained variance was still rising."""


@dataclass(frozen=True)
class Convergence:
    """When training without an epoch count stops (see the module docstring, "How long").

    Attributes:
        min_steps: steps before a plateau may end the run (small sets are repeated over to reach it).
        max_steps: the budget; a single pass longer than it is still completed (all the data given is read once).
        window: steps per window; the plateau test compares the mean training explained variance of the last two.
        tol: the least gain (explained variance, absolute) between those two windows that counts as still rising.
            The per-step value is measured on one batch: its noise, averaged over ``window`` steps, has to stay well
            below ``tol`` (on the planted dictionary of tests/test_features_sae.py, batch 256, the window means'
            step-to-step spread at the plateau is ~2e-4).
    """

    min_steps: int = 2000
    max_steps: int = 50_000
    window: int = 200
    tol: float = 1e-3

    def check(self) -> None:
        if not (1 <= self.window and 1 <= self.min_steps <= self.max_steps and self.tol >= 0):
            raise SAEError(f"convergence settings need 1 <= window, 1 <= min_steps <= max_steps and tol >= 0, not "
                           f"{self}.")


class History:
    """The last 2·window per-step explained variances: the plateau test and what a stopped run reports."""

    def __init__(self, window: int, values=()):
        self.window = int(window)
        self.values = deque((float(v) for v in values), maxlen=2 * self.window)

    def add(self, explained_variance: float) -> None:
        self.values.append(float(explained_variance))

    def final(self) -> float | None:
        """Mean explained variance of the last ``window`` steps (fewer if fewer were run)."""
        last = list(self.values)[-self.window:]
        return sum(last) / len(last) if last else None

    def gain(self) -> float | None:
        """Mean of the last w steps minus mean of the w before, w = min(window, steps // 2); None below 2 steps."""
        w = min(self.window, len(self.values) // 2)
        if w < 1:
            return None
        values = list(self.values)
        return sum(values[-w:]) / w - sum(values[-2 * w:-w]) / w

    def tensor(self) -> torch.Tensor:
        return torch.tensor(list(self.values), dtype=torch.float64)


def stop_record(history: History, reason: str, budget: str, tol: float) -> dict:
    """``info["training"]``'s account of why a run stopped; warns (:class:`NotConvergedWarning`) when it stopped on
    its ``budget`` (a phrase: "max_steps=50000", "epochs=5") while the explained variance was still rising by ``tol`` or
    more per window (or too few steps were run to tell)."""
    gain, final = history.gain(), history.final()
    rising = reason == "budget" and (gain is None or gain >= tol)
    sentence = None
    if rising:
        w = min(history.window, len(history.values) // 2)
        told = ("too few steps to tell whether it had converged" if gain is None else
                f"the explained variance still rising (the mean of the last {w} steps {gain:+.4f} on the {w} before)")
        sentence = (f"SAE training stopped on its budget ({budget}) at explained variance {final:.3f} (the mean of "
                    f"its last {min(history.window, len(history.values))} steps) with {told}: "
                    "train longer (more epochs or steps, or leave the epoch count out to train until it converges).")
        warnings.warn(sentence, NotConvergedWarning, stacklevel=3)
    return {"stop_reason": reason, "budget": budget, "explained_variance": final, "explained_variance_gain": gain,
            "still_rising": rising, "warning": sentence,
            "explained_variance_definition": f"training batches' 1 - NMSE, mean of the last {history.window} steps; "
                                             "gain: that mean minus the mean of as many steps before"}


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
        array = _as_array(activations)
        one_shot = False
        if array is not None:
            first = array
            n_batches = math.ceil(len(array) / batch_size)

            def batches(epoch):
                order = np.random.default_rng([int(seed), epoch]).permutation(len(array))
                for s in range(0, len(array), batch_size):
                    yield array[torch.from_numpy(order[s:s + batch_size])]
        else:
            iterable = activations
            one_shot = iter(iterable) is iterable
            if one_shot and epochs not in (None, 1):
                raise SAEError("a one-shot iterator of batches is one epoch: give a list of batches (or an array) "
                               "for more epochs.")
            stream = iter(iterable)
            first = torch.as_tensor(np.asarray(next(stream)), dtype=torch.float32)
            n_batches = None

            def batches(epoch):
                if epoch == 0:
                    yield first
                    yield from (torch.as_tensor(np.asarray(b), dtype=torch.float32) for b in stream)
                else:
                    yield from (torch.as_tensor(np.asarray(b), dtype=torch.float32) for b in iterable)
        from ..sources.models import resolve_device

        sae = cls(first.shape[-1], latents, topk, info=info).init_from(first, seed).to(resolve_device(str(device)))
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
            total = None if n_batches is None else n_batches * epochs if epochs else None
            bar = tqdm(total=total, initial=trainer.step_count, unit="step", desc="SAE")
        for epoch in range(epochs) if epochs else itertools.count():
            if trainer.stopped or (epoch > 0 and one_shot):
                break
            if epoch < trainer.epoch:
                continue  # done before the checkpoint this run resumed from
            for index, batch in enumerate(batches(epoch)):
                if (epoch, index) < (trainer.epoch, trainer.batch):
                    continue  # done before the checkpoint this run resumed from
                metrics = trainer.step(batch)
                trainer.epoch, trainer.batch = (epoch, index + 1)
                if epochs is None and epoch > 0:  # all the data read once: the plateau and the budget may end it
                    trainer.stopped = converged(trainer, until)
                if path is not None and (trainer.step_count % checkpoint_every == 0 or trainer.stopped):
                    trainer.save_checkpoint(path)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(_postfix(metrics), refresh=False)
                if callback is not None:
                    callback(trainer.step_count, metrics)
                if trainer.stopped:
                    break
            else:
                trainer.epoch, trainer.batch = epoch + 1, 0
                if epochs is None:  # a first pass may be longer than the budget: it is completed
                    trainer.stopped = converged(trainer, until, pass_end=True)
        if not trainer.stopped:  # the epochs asked for, or the one-shot stream, ran out
            trainer.stopped = "budget"
        if path is not None:
            trainer.save_checkpoint(path)
        if bar is not None:
            bar.close()
        budget = (f"epochs={epochs}" if epochs else "the one-shot iterator's batches" if one_shot and
                  trainer.step_count < until.max_steps else f"max_steps={until.max_steps}")
        sae.info["training"] = {**trainer.settings, "steps": trainer.step_count, "tokens": trainer.tokens,
                                "epochs": (round(trainer.tokens / len(array), 3) if array is not None else
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


def converged(trainer: "Trainer", until: Convergence, pass_end: bool = False) -> str | None:
    """``"plateau"``, ``"budget"`` or None (train on), asked after a step of a run that has read all its data once;
    the plateau is tested every ``window`` steps and at the end of every pass."""
    if trainer.step_count >= until.min_steps and (pass_end or trainer.step_count % until.window == 0):
        gain = trainer.history.gain()
        if gain is not None and gain < until.tol:
            return "plateau"
    return "budget" if trainer.step_count >= until.max_steps else None


def _topk_relu(pre: torch.Tensor, k: int) -> torch.Tensor:
    values, index = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, index, values.relu())


def _sparse_decode(index: torch.Tensor, values: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """Σ_j values_j W_dec[index_j] per row: (b, k) indices and values -> (b, D), reading k rows of W_dec instead of a
    dense (b, K) @ (K, D) product (the paper's sparse decoder; K / k times fewer multiplications)."""
    return torch.nn.functional.embedding_bag(index, W_dec, per_sample_weights=values, mode="sum")


def _as_array(activations) -> torch.Tensor | None:
    if isinstance(activations, torch.Tensor):
        return activations.detach().to("cpu", torch.float32)
    if isinstance(activations, np.ndarray):
        if activations.ndim != 2:
            raise SAEError(f"activations must be (n, D), not {activations.shape}.")
        return torch.from_numpy(np.ascontiguousarray(activations, dtype=np.float32))
    return None


def _postfix(m: dict) -> dict:
    return {"NMSE": f"{m['nmse']:.3f}", "EV": f"{m['explained_variance']:.3f}", "L0": f"{m['l0']:.1f}",
            "dead": f"{m['dead_fraction']:.2f}"}


class Trainer:
    """Adam on an :class:`SAE` with the decoder kept on the unit sphere and the auxiliary-k loss; resumable.

    Args:
        lr: default the paper's 2e-4 / sqrt(K / 2^14).
        dead_after: tokens without firing after which a latent is dead.

    Attributes:
        step_count, tokens: steps and tokens trained so far; epoch, batch: where the data stream stands (for
        resuming); last: the last step's metrics; history: the last 2·window steps' explained variances
        (:class:`History`); stopped: why training ended (``"plateau"``, ``"budget"``), None while it runs.
    """

    def __init__(self, sae: SAE, lr: float | None = None, dead_after: int = 100_000, window: int = 200):
        if sae.activation != "topk_relu" or not sae.centre_input:
            raise SAEError(f"only TopK SAEs (ReLU of the top k, input centred on b_dec) are trained here, not "
                           f"{sae.activation!r} ones.")
        self.sae = sae
        lr = 2e-4 / math.sqrt(sae.latents / 2 ** 14) if lr is None else float(lr)
        self.settings = {"lr": lr, "dead_after": int(dead_after), "aux_coef": AUX_COEF,
                         "aux_k": max(1, sae.d_model // 2), "optimizer": "Adam(betas=(0.9, 0.999), eps=6.25e-10)"}
        self.opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.step_count = self.tokens = self.epoch = self.batch = 0
        self.last_fired = torch.zeros(sae.latents, dtype=torch.int64)  # tokens seen when each latent last fired
        self.last: dict = {}
        self.history = History(window)
        self.stopped: str | None = None

    def dead(self) -> torch.Tensor:
        """(K,) bool: latents that fired on none of the last ``dead_after`` tokens (none before that many)."""
        return (self.tokens - self.last_fired) >= self.settings["dead_after"]

    def step(self, x: torch.Tensor) -> dict:
        """One Adam step on a batch (b, D) in the input's units -> its metrics (before the step)."""
        sae = self.sae.train()
        x = x.to(sae.W_dec.device, torch.float32)
        xs = x * sae.scale
        pre = sae.pre_activations(x)
        values, index = pre.topk(sae.topk, dim=-1)
        values = values.relu()
        xs_hat = _sparse_decode(index, values, sae.W_dec) + sae.b_dec
        err = (xs - xs_hat).pow(2).sum()
        var = (xs - xs.mean(0)).pow(2).sum().clamp_min(1e-12)
        loss = err / var
        dead = self.dead().to(pre.device)
        n_dead = int(dead.sum())
        aux = torch.zeros(())
        if n_dead:
            k_aux = min(self.settings["aux_k"], n_dead)
            residual = (xs - xs_hat).detach()
            aux_values, aux_index = pre.masked_fill(~dead, -torch.inf).topk(k_aux, dim=-1)
            aux_hat = _sparse_decode(aux_index, aux_values.relu(), sae.W_dec)
            aux = (residual - aux_hat).pow(2).sum() / residual.pow(2).sum().clamp_min(1e-12)
            loss = loss + AUX_COEF * aux
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            W, g = sae.W_dec, sae.W_dec.grad
            g -= (g * W).sum(-1, keepdim=True) * W  # keep only the component tangent to each unit row
        self.opt.step()
        with torch.no_grad():
            sae.W_dec /= sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        self.tokens += len(x)
        active = values.detach() > 0
        self.last_fired[index[active].unique().cpu()] = self.tokens
        self.step_count += 1
        nmse = float(err.detach() / var.detach())
        self.last = {"nmse": nmse, "explained_variance": 1 - nmse, "l0": float(active.sum(-1).float().mean()),
                     "dead_fraction": n_dead / sae.latents, "aux_loss": float(aux.detach()), "step": self.step_count,
                     "tokens": self.tokens}
        self.history.add(self.last["explained_variance"])
        return self.last

    # --- resuming --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"sae": {k: v.detach().cpu() for k, v in self.sae.state_dict().items()},
                "optimizer": self.opt.state_dict(), "last_fired": self.last_fired.clone(),
                "counters": torch.tensor([self.step_count, self.tokens, self.epoch, self.batch]),
                "last": json.dumps(self.last), "settings": json.dumps(self.settings),
                "history": self.history.tensor(), "stopped": json.dumps(self.stopped)}

    def load_state_dict(self, state: dict) -> None:
        self.sae.load_state_dict(state["sae"])
        self.opt.load_state_dict(state["optimizer"])
        self.last_fired = state["last_fired"].clone()
        self.step_count, self.tokens, self.epoch, self.batch = (int(v) for v in state["counters"])
        self.last = json.loads(state["last"])
        self.history = History(self.history.window, state["history"].tolist())
        self.stopped = json.loads(state["stopped"])
        settings = json.loads(state["settings"])
        if settings != self.settings:
            raise SAEError(f"the checkpoint was trained with {settings}, not {self.settings}: use a new folder or "
                           "the same settings.")

    def save_checkpoint(self, path: str | Path) -> None:
        """The whole training state, written atomically (torch.save of tensors only: reads with weights_only)."""
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        atomic_write_bytes(Path(path), buffer.getvalue())

    def load_checkpoint(self, path: str | Path) -> None:
        try:
            state = torch.load(Path(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle and zip errors of a damaged file
            raise SAEError(f"{path}: not a readable training checkpoint ({type(exc).__name__}: {exc}).") from exc
        self.load_state_dict(state)


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
