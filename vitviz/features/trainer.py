"""Training a TopK SAE (:class:`vitviz.features.sae.SAE`): the Adam step with the decoder kept on the unit sphere
and the auxiliary-k loss for dead latents (:class:`Trainer`, resumable), the epochs that stop on a plateau of the
explained variance or on a budget (:class:`Convergence`, :func:`run_epochs`) and the account of why a run stopped
(:func:`stop_record`). The arithmetic and the stopping rule are written out in :mod:`vitviz.features.sae`'s docstring;
:meth:`vitviz.features.sae.SAE.fit` and ``features train`` (:mod:`vitviz.features.train`) drive it.

The trainer reads an SAE through its parameters and :meth:`~vitviz.features.sae.SAE.pre_activations` only, so this
module stands below the SAE's own (which re-exports its public names).
"""
from __future__ import annotations

import io
import itertools
import json
import math
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import VitvizError
from ..io.atomic import atomic_write_bytes

AUX_COEF = 1 / 32  # the paper's alpha for the auxiliary-k loss


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


def converged(trainer: "Trainer", until: Convergence, pass_end: bool = False) -> str | None:
    """``"plateau"``, ``"budget"`` or None (train on), asked after a step of a run that has read all its data once;
    the plateau is tested every ``window`` steps and at the end of every pass."""
    if trainer.step_count >= until.min_steps and (pass_end or trainer.step_count % until.window == 0):
        gain = trainer.history.gain()
        if gain is not None and gain < until.tol:
            return "plateau"
    return "budget" if trainer.step_count >= until.max_steps else None


def _sparse_decode(index: torch.Tensor, values: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """Σ_j values_j W_dec[index_j] per row: (b, k) indices and values -> (b, D), reading k rows of W_dec instead of a
    dense (b, K) @ (K, D) product (the paper's sparse decoder; K / k times fewer multiplications)."""
    return torch.nn.functional.embedding_bag(index, W_dec, per_sample_weights=values, mode="sum")


def bar_postfix(m: dict) -> dict:
    """A step's metrics as a progress bar's short postfix (NMSE, EV, L0, dead)."""
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

    def __init__(self, sae: "SAE", lr: float | None = None, dead_after: int = 100_000, window: int = 200):
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


def run_epochs(trainer: Trainer, batches: Callable[[int], object], epochs: int | None, until: Convergence,
               one_shot: bool = False, checkpoint: Path | None = None, checkpoint_every: int = 100,
               on_step: Callable[[dict], None] | None = None) -> None:
    """Step ``trainer`` through ``batches(epoch)`` (an iterable of (b, D) batches per epoch) from where it stands
    (a resumed trainer skips what its checkpoint holds) until ``epochs`` passes, or, with ``epochs`` None, until
    ``until`` stops it once all the data was read (a first pass is always completed); a ``one_shot`` stream is one
    epoch. ``trainer.stopped`` ends ``"plateau"`` or ``"budget"``.

    ``checkpoint``: a file written every ``checkpoint_every`` steps, when it stops, and at the end;
    ``on_step(metrics)`` after every step.
    """
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
            if checkpoint is not None and (trainer.step_count % checkpoint_every == 0 or trainer.stopped):
                trainer.save_checkpoint(checkpoint)
            if on_step is not None:
                on_step(metrics)
            if trainer.stopped:
                break
        else:
            trainer.epoch, trainer.batch = epoch + 1, 0
            if epochs is None:  # a first pass may be longer than the budget: it is completed
                trainer.stopped = converged(trainer, until, pass_end=True)
    if not trainer.stopped:  # the epochs asked for, or the one-shot stream, ran out
        trainer.stopped = "budget"
    if checkpoint is not None:
        trainer.save_checkpoint(checkpoint)
