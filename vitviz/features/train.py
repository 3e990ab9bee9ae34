"""``python -m vitviz features train``: a TopK SAE on one layer's tokens of an image set, streamed, resumable.

Images go through the model ``batch_size`` files at a time, each forward stopped right after the point; the
batch's tokens (B · n of them) are shuffled by a permutation of (seed, epoch, batch) and cut into SAE steps of
``batch_tokens`` rows. Nothing but one batch of tokens is in memory. After every image batch the whole training
state (weights, Adam, dead-latent counters, where the stream stands) is written atomically to
``DIR/checkpoint.pt`` (after every batch of images the model or the shards gave, every :data:`CHECKPOINT_STEPS`
steps while an epoch is read from memory, and at the end); running the same command again continues from it and
ends with the weights of an uninterrupted run. The SAE is initialised on the first batch's tokens (b_dec at their
mean, the scale from their spread).

Without ``epochs`` it trains until converged, as :meth:`vitviz.SAE.fit` does (:class:`vitviz.features.sae.Convergence`:
at least one pass and 2,000 steps, then until the explained variance plateaus, at most 50,000 steps). A small image
set is repeated over many epochs: its tokens are kept in memory after the first (while they fit in
:data:`HOLD_BYTES`), so the model runs once, not once per epoch; the tokens are the same, and so are the weights.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import platform
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import VitvizError
from .data import flat, shuffled, token_batches
from .sae import SAE
from .trainer import Convergence, SAEError, Trainer, bar_postfix, converged, stop_record

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_STEPS = 100  # after the first epoch: repeats of a small set are one or a few steps each
HOLD_BYTES = 1 << 30  # an image set's tokens up to this size are kept in memory for the later epochs


@dataclass(frozen=True)
class TrainSettings:
    """What decides the weights (all of it goes into sae.json and is checked when resuming).

    Attributes:
        layer: 1-based block (``features train --layer``); the point name in sae.json is 0-based.
        epochs: passes over the images; None: until converged (:class:`vitviz.features.sae.Convergence`()).
        batch_size: images per forward. batch_tokens: tokens per SAE step.
        prefix: train on the prefix tokens (CLS, registers) as well as the patch tokens.
        dead_after: tokens without firing after which a latent is dead (default 16 steps' worth).
    """

    point: str
    layer: int
    latents: int
    topk: int
    seed: int = 0
    epochs: int | None = None
    batch_size: int = 8
    batch_tokens: int = 1024
    prefix: bool = False
    lr: float | None = None
    dead_after: int | None = None

    def check(self) -> None:
        for name in ("latents", "topk", "epochs", "batch_size", "batch_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise VitvizError(f"--{name.replace('_', '-')} must be 1 or more, not {getattr(self, name)}.")
        if self.topk > self.latents:
            raise VitvizError(f"--topk {self.topk} is more than --latents {self.latents}: at most K latents can fire.")


def _files_digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def versions() -> dict:
    import timm

    from .. import __version__

    return {"vitviz": __version__, "timm": timm.__version__, "torch": torch.__version__,
            "python": platform.python_version()}


def train(lens, files: list, settings: TrainSettings, out: Path, progress: bool = True,
          callback: Callable[[int, dict], None] | None = None, engine=None, shards: str | Path | None = None) -> SAE:
    """Train, checkpoint after every image batch, write ``sae.safetensors`` + ``sae.json`` into ``out``.

    Args:
        lens: the opened model (:func:`vitviz.open`).
        files: :class:`vitviz.io.inputs.ImageFile` in the order they are read.
        callback: ``fn(image batches done, last metrics)`` after each image batch (tests stop runs with it).
        engine: where the forwards run (:class:`vitviz.runs.engines.Engine`: this process, or Ray actors whose
            tokens stream back here into the trainer); default this process.
        shards: a folder of float16 shards (:mod:`vitviz.features.shards`): the missing ones are written first, then
            every epoch reads them instead of running the model. None: every epoch streams from the model.

    Returns:
        the SAE (also written to ``out``), its ``info`` the content of sae.json (``info["training"]`` says why it
        stopped, as :meth:`vitviz.SAE.fit`'s does).

    Warns:
        NotConvergedWarning: it stopped on its budget while the explained variance was still rising.

    Raises:
        VitvizError: a setting that does not fit the model, or a checkpoint in ``out`` from other settings or images.
    """
    settings.check()
    names = [f.name for f in files]
    run = {"model": lens.spec.name, "checkpoint": lens.spec.checkpoint, "img_size": lens.spec.img_size,
           **asdict(settings), "images_sha256": _files_digest(names),
           "token_dtype": "float32" if shards is None else "float16"}
    until = Convergence() if settings.epochs is None else None
    if until is not None:
        run["until"] = asdict(until)
    Path(out).mkdir(parents=True, exist_ok=True)
    state = _State.resume(Path(out) / CHECKPOINT, run, settings, until)
    if shards is not None:
        shards = _write_shards(lens, files, settings, run, shards, engine, progress)

    def read(start: int):
        if shards is not None:
            return shards.read(start)
        return token_batches(lens, files, settings.point, settings.layer, settings.batch_size, settings.prefix,
                             start=start, engine=engine)

    n_batches = math.ceil(len(files) / settings.batch_size)
    bar = _bar(n_batches * settings.epochs if settings.epochs else None, progress,
               0 if state.trainer is None else state.trainer.epoch * n_batches + state.trainer.batch)
    _train_epochs(state, lens, read, n_batches, bar, callback)
    bar.close()
    trainer = state.trainer
    if trainer is None:
        raise VitvizError("no image could be read: nothing to train on.")
    trainer.stopped = trainer.stopped or "budget"  # the epochs asked for ran out
    if settings.epochs:
        trainer.epoch, trainer.batch = settings.epochs, 0
    state.checkpoint()
    stopped = stop_record(trainer.history, trainer.stopped,
                          f"epochs={settings.epochs}" if settings.epochs else f"max_steps={until.max_steps}",
                          (until or Convergence()).tol)  # warns here: the caller of train is who is told
    state.sae.info = _sae_info(lens, state, names, stopped)
    state.sae.to("cpu").save(out)
    return state.sae


class _State:
    """What a run carries from image batch to image batch and into its checkpoint: the trainer and its SAE (None
    until the first tokens arrive), the running metrics, the files skipped, the moments of the tokens read."""

    def __init__(self, path: Path, run: dict, settings: TrainSettings, until: Convergence | None):
        self.path, self.run, self.settings, self.until = path, run, settings, until
        self.trainer: Trainer | None = None
        self.sae: SAE | None = None
        self.last_epoch, self.problems, self.seen = _Running(None if until is None else until.window), [], _Moments()
        self.written = 0  # the step count at the last checkpoint

    @classmethod
    def resume(cls, path: Path, run: dict, settings: TrainSettings, until: Convergence | None) -> "_State":
        """A fresh state, or the one ``path`` holds when it is a checkpoint of the same run (refused otherwise)."""
        state = cls(path, run, settings, until)
        if not path.exists():
            return state
        saved = _read_checkpoint(path)
        if json.loads(saved["run"]) != run:
            raise VitvizError(f"{path} is a checkpoint of another run ({_differences(json.loads(saved['run']), run)}): "
                              "give a new --out, or the same images and settings to continue it.")
        K, D = saved["sae"]["W_dec"].shape
        state.sae = SAE(D, K, settings.topk)
        state.trainer = _trainer(state.sae, settings, until)
        state.trainer.load_state_dict(saved)
        running, state.problems = json.loads(saved["running"])
        state.last_epoch.load(running)
        state.seen.load(saved)
        state.written = state.trainer.step_count
        return state

    def start(self, tokens: torch.Tensor) -> None:
        """The SAE initialised on the first batch's tokens (b_dec at their mean, the scale from their spread)."""
        self.sae = SAE(tokens.shape[-1], self.settings.latents, self.settings.topk).to(tokens.device)
        self.sae.init_from(tokens, self.settings.seed)
        self.trainer = _trainer(self.sae, self.settings, self.until)

    def checkpoint(self) -> None:
        _write_checkpoint(self.trainer, self.run, [self.last_epoch.state(), self.problems], self.seen, self.path)
        self.written = self.trainer.step_count


def _write_shards(lens, files: list, settings: TrainSettings, run: dict, folder, engine, progress: bool):
    """The missing float16 shards written (:func:`vitviz.features.shards.write_shards`); returns what reads them."""
    from .shards import write_shards

    keys = ("model", "checkpoint", "img_size", "point", "layer", "prefix", "batch_size", "images_sha256")
    bar = _bar(math.ceil(len(files) / settings.batch_size), progress, 0, "float16 shards")
    shards = write_shards(lens, files, settings.point, settings.layer, settings.batch_size, settings.prefix, folder,
                          {k: run[k] for k in keys}, engine, progress=lambda _: bar.update(1))
    bar.close()
    return shards


def _train_epochs(state: _State, lens, read: Callable, n_batches: int, bar, callback) -> None:
    """Every epoch's image batches from where ``state`` stands (held in memory after the first while they fit),
    stepping, testing convergence and checkpointing; ``callback(image batches done, last metrics)``."""
    settings, until = state.settings, state.until
    held = _Held(n_batches, HOLD_BYTES if settings.epochs != 1 else 0)
    for epoch in range(settings.epochs) if settings.epochs else itertools.count():
        trainer = state.trainer
        if trainer is not None and (trainer.stopped or epoch < trainer.epoch):
            if trainer.stopped:
                break
            continue
        start = 0 if trainer is None or epoch > trainer.epoch else trainer.batch
        if start == 0:
            state.last_epoch.new_epoch()
        from_memory = held.complete()
        for batch in held.read(read, start):
            state.problems += [p for p in batch.problems if epoch == 0]
            if batch.names:
                _train_on(state, flat(batch.tokens).to(lens.device), epoch, batch.index)  # shards, Ray: CPU
            trainer = state.trainer
            if trainer is None:
                continue
            trainer.epoch, trainer.batch = epoch, batch.index + 1
            if trainer.batch == n_batches and until is not None and not trainer.stopped:
                trainer.stopped = converged(trainer, until, pass_end=True)
            if not from_memory or trainer.stopped or trainer.step_count - state.written >= CHECKPOINT_STEPS:
                state.checkpoint()
            bar.update(1)
            if trainer.last:
                bar.set_postfix(bar_postfix(trainer.last), refresh=False)
            if callback is not None:
                callback(epoch * n_batches + batch.index + 1, trainer.last)
            if trainer.stopped:
                break


def _train_on(state: _State, tokens: torch.Tensor, epoch: int, index: int) -> None:
    """One image batch's tokens (n, D), shuffled by (seed, epoch, batch), in SAE steps of ``batch_tokens`` rows;
    after the first pass the plateau and the budget may stop it between steps."""
    settings, until = state.settings, state.until
    if epoch == 0:
        state.seen.add(tokens)
    if state.trainer is None:
        state.start(tokens)
    trainer = state.trainer
    tokens = shuffled(tokens, settings.seed, epoch, index)
    for s in range(0, len(tokens), settings.batch_tokens):
        metrics = trainer.step(tokens[s:s + settings.batch_tokens])
        state.last_epoch.add(metrics, len(tokens[s:s + settings.batch_tokens]))
        if until is not None and epoch > 0:  # all the images read once: plateau and budget may end it
            trainer.stopped = converged(trainer, until)
            if trainer.stopped:
                break


def _sae_info(lens, state: _State, names: list[str], stopped: dict) -> dict:
    """sae.json's content beyond the weights: the model, the point, the images, how training went and why it
    stopped (``stopped``: :func:`vitviz.features.trainer.stop_record`)."""
    settings, until, trainer, run, seen = state.settings, state.until, state.trainer, state.run, state.seen
    final = state.last_epoch.result() or trainer.last
    final["dead_fraction"] = float(trainer.dead().float().mean())
    card = lens.loaded.card()
    return {
        "model": {"name": lens.spec.name, "label": lens.label, "checkpoint": lens.spec.checkpoint,
                  "img_size": lens.spec.img_size, "token_layout": card["token_layout"]},
        "point": f"blocks.{settings.layer - 1}.{settings.point}", "point_kind": settings.point,
        "layer": settings.layer,
        "layers": "layer is 1-based (as on the command line); the point name is 0-based",
        "tokens_read": "patch and prefix tokens" if settings.prefix else "patch tokens",
        "images": {"count": len(names) - len(state.problems), "names": names, "skipped": state.problems,
                   "sha256_of_names": run["images_sha256"]},
        "training": {**trainer.settings, **asdict(settings), "steps": trainer.step_count, "tokens": trainer.tokens,
                     "epochs_run": round(trainer.tokens / max(seen.n, 1), 3), **stopped},
        "metrics": final,
        "activations": seen.result(),
        "metrics_definition": ("the last epoch's" if settings.epochs else f"the last {until.window} steps'")
                              + " training batches, token-weighted (nmse = sum ||x - x_hat||^2 / "
                              "sum ||x - batch mean||^2 per step); dead_fraction: latents that fired on none of "
                              "the last dead_after tokens",
        "versions": versions(),
    }


def _trainer(sae: SAE, settings: TrainSettings, until: Convergence | None) -> Trainer:
    return Trainer(sae, lr=settings.lr,
                   dead_after=16 * settings.batch_tokens if settings.dead_after is None else settings.dead_after,
                   window=(until or Convergence()).window)


def _write_checkpoint(trainer: Trainer, run: dict, running: list, seen: "_Moments", path: Path) -> None:
    """The trainer's state with the run's settings, the running metrics and skipped files (JSON) and the moments of
    the tokens read."""
    import io

    from ..io.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save(trainer.state_dict() | {"run": json.dumps(run), "running": json.dumps(running)} | seen.state(), buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _read_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip and unpickling errors of a damaged file
        raise SAEError(f"{path}: not a readable training checkpoint ({type(exc).__name__}: {exc}); delete it to "
                       "start again.") from exc


def _differences(old: dict, new: dict) -> str:
    keys = [k for k in new if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys[:3])


class _Running:
    """Token-weighted means of the step metrics over the current epoch (``window`` None) or the last ``window``
    steps: entries of (metric × tokens sums, tokens), one per step in a window, one for the whole epoch otherwise."""

    KEYS = ("nmse", "explained_variance", "l0")

    def __init__(self, window: int | None = None):
        self.window = window
        self.entries = deque(maxlen=window)

    def new_epoch(self) -> None:
        if self.window is None:
            self.entries.clear()

    def add(self, metrics: dict, n: int) -> None:
        values = [metrics[k] * n for k in self.KEYS]
        if self.window is None and self.entries:
            sums, m = self.entries.pop()
            values, n = [a + b for a, b in zip(sums, values)], m + n
        self.entries.append((values, n))

    def result(self) -> dict:
        n = sum(m for _, m in self.entries)
        return {k: sum(v[i] for v, _ in self.entries) / n for i, k in enumerate(self.KEYS)} if n else {}

    def state(self) -> list:
        return list(self.entries)

    def load(self, entries: list) -> None:
        self.entries.extend((list(v), m) for v, m in entries)


class _Held:
    """The image set's token batches kept in memory once read, while their total stays within ``limit`` bytes: the
    later epochs read them from here (the same tensors the model or the shards would give again)."""

    def __init__(self, n_batches: int, limit: int):
        self.n_batches, self.limit, self.bytes = n_batches, limit, 0
        self.batches: dict[int, object] = {}

    def complete(self) -> bool:
        return len(self.batches) == self.n_batches

    def read(self, source: Callable, start: int):
        """The batches from ``start``: from memory when all are held, else from ``source(start)`` (kept)."""
        if self.complete():
            yield from (self.batches[i] for i in range(start, self.n_batches))
            return
        for batch in source(start):
            if self.limit and batch.index not in self.batches:
                self.bytes += batch.tokens.numel() * batch.tokens.element_size()
                self.batches[batch.index] = batch
                if self.bytes > self.limit:  # too large to hold: every epoch reads the source
                    self.batches.clear()
                    self.limit = 0
            yield batch


class _Moments:
    """Count, sum and sum of squares (float64, per dimension) of the tokens the first epoch read."""

    def __init__(self):
        self.n, self.sum, self.sumsq = 0, None, None

    def add(self, tokens: torch.Tensor) -> None:
        x = tokens.detach().to("cpu", torch.float64)
        self.n += len(x)
        self.sum = x.sum(0) if self.sum is None else self.sum + x.sum(0)
        self.sumsq = x.pow(2).sum(0) if self.sumsq is None else self.sumsq + x.pow(2).sum(0)

    def state(self) -> dict:
        return {} if self.sum is None else {"token_count": torch.tensor(self.n), "token_sum": self.sum,
                                            "token_sumsq": self.sumsq}

    def load(self, state: dict) -> None:
        if "token_sum" in state:
            self.n, self.sum, self.sumsq = int(state["token_count"]), state["token_sum"], state["token_sumsq"]

    def mean_variance(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(D,) mean and (D,) variance (population) of the tokens read."""
        mean = self.sum / self.n
        return mean, self.sumsq / self.n - mean.pow(2)

    def result(self) -> dict:
        """sae.json's ``activations``: tokens read, the norm of their mean, their total variance (sum over D)."""
        if not self.n:
            return {}
        mean, variance = self.mean_variance()
        return {"tokens": self.n, "mean_norm": float(mean.norm()), "total_variance": float(variance.sum()),
                "definition": "over the first epoch's tokens, in the layer's units: ||mean||, sum_d Var(x_d)"}


class _NoBar:
    def update(self, n): pass

    def set_postfix(self, *a, **k): pass

    def close(self): pass


def _bar(total: int, progress: bool, initial: int, desc: str = "features train"):
    if not progress:
        return _NoBar()
    import sys

    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="batch", desc=desc, file=sys.stderr)
