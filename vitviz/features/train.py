"""``python -m vitviz features train``: a TopK SAE on one layer's tokens of an image set, streamed, resumable.

Images go through the model ``batch_size`` files at a time, each forward stopped right after the point; the
batch's tokens (B · n of them) are shuffled by a permutation of (seed, epoch, batch) and cut into SAE steps of
``batch_tokens`` rows. Nothing but one batch of tokens is in memory. After every image batch the whole training
state (weights, Adam, dead-latent counters, where the stream stands) is written atomically to
``DIR/checkpoint.pt``; running the same command again continues from it and ends with the weights of an
uninterrupted run. The SAE is initialised on the first batch's tokens (b_dec at their mean, the scale from their
spread).
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import VitvizError
from .data import flat, shuffled, token_batches
from .sae import SAE, SAEError, Trainer, _postfix

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainSettings:
    """What decides the weights (all of it goes into sae.json and is checked when resuming).

    Attributes:
        layer: 1-based block (``features train --layer``); the point name in sae.json is 0-based.
        batch_size: images per forward. batch_tokens: tokens per SAE step.
        prefix: train on the prefix tokens (CLS, registers) as well as the patch tokens.
        dead_after: tokens without firing after which a latent is dead (default 16 steps' worth).
    """

    point: str
    layer: int
    latents: int
    topk: int
    seed: int = 0
    epochs: int = 1
    batch_size: int = 8
    batch_tokens: int = 1024
    prefix: bool = False
    lr: float | None = None
    dead_after: int | None = None

    def check(self) -> None:
        for name in ("latents", "topk", "epochs", "batch_size", "batch_tokens"):
            if getattr(self, name) < 1:
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
        callback: ``fn(image batches done, last metrics)`` after each checkpoint (tests stop runs with it).
        engine: where the forwards run (:class:`vitviz.runs.engines.Engine`: this process, or Ray actors whose
            tokens stream back here into the trainer); default this process.
        shards: a folder of float16 shards (:mod:`vitviz.features.shards`): the missing ones are written first, then
            every epoch reads them instead of running the model. None: every epoch streams from the model.

    Returns:
        the SAE (also written to ``out``), its ``info`` the content of sae.json.

    Raises:
        VitvizError: a setting that does not fit the model, or a checkpoint in ``out`` from other settings or images.
    """
    settings.check()
    names = [f.name for f in files]
    run = {"model": lens.spec.name, "checkpoint": lens.spec.checkpoint, "img_size": lens.spec.img_size,
           **asdict(settings), "images_sha256": _files_digest(names),
           "token_dtype": "float32" if shards is None else "float16"}
    point = f"blocks.{settings.layer - 1}.{settings.point}"
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / CHECKPOINT
    trainer = sae = None
    last_epoch, problems, seen = _Running(), [], _Moments()
    if path.exists():
        state = _read_checkpoint(path)
        if json.loads(state["run"]) != run:
            raise VitvizError(f"{path} is a checkpoint of another run ({_differences(json.loads(state['run']), run)}): "
                              "give a new --out, or the same images and settings to continue it.")
        K, D = state["sae"]["W_dec"].shape
        sae = SAE(D, K, settings.topk)
        trainer = _trainer(sae, settings)
        trainer.load_state_dict(state)
        last_epoch.sums, last_epoch.n, problems = json.loads(state["running"])
        seen.load(state)
    if shards is not None:
        from .shards import write_shards

        keys = ("model", "checkpoint", "img_size", "point", "layer", "prefix", "batch_size", "images_sha256")
        bar = _bar(math.ceil(len(files) / settings.batch_size), progress, 0, "float16 shards")
        shards = write_shards(lens, files, settings.point, settings.layer, settings.batch_size, settings.prefix, shards,
                              {k: run[k] for k in keys}, engine, progress=lambda _: bar.update(1))
        bar.close()

    def stream(start: int):
        if shards is not None:
            return shards.read(start)
        return token_batches(lens, files, settings.point, settings.layer, settings.batch_size, settings.prefix,
                             start=start, engine=engine)

    n_batches = math.ceil(len(files) / settings.batch_size)
    bar = _bar(n_batches * settings.epochs, progress, 0 if trainer is None else trainer.epoch * n_batches + trainer.batch)
    for epoch in range(settings.epochs):
        start = 0 if trainer is None or epoch > trainer.epoch else trainer.batch
        if trainer is not None and epoch < trainer.epoch:
            continue
        for batch in stream(start):
            problems += [p for p in batch.problems if epoch == 0]
            if batch.names:
                tokens = flat(batch.tokens).to(lens.device)  # shards and Ray actors give CPU tensors
                if epoch == 0:
                    seen.add(tokens)
                if trainer is None:
                    sae = SAE(tokens.shape[-1], settings.latents, settings.topk).to(tokens.device)
                    sae.init_from(tokens, settings.seed)
                    trainer = _trainer(sae, settings)
                tokens = shuffled(tokens, settings.seed, epoch, batch.index)
                for s in range(0, len(tokens), settings.batch_tokens):
                    metrics = trainer.step(tokens[s:s + settings.batch_tokens])
                    if epoch == settings.epochs - 1:
                        last_epoch.add(metrics, len(tokens[s:s + settings.batch_tokens]))
            if trainer is None:
                continue
            trainer.epoch, trainer.batch = epoch, batch.index + 1
            _write_checkpoint(trainer, run, [last_epoch.sums, last_epoch.n, problems], seen, path)
            bar.update(1)
            if trainer.last:
                bar.set_postfix(_postfix(trainer.last), refresh=False)
            if callback is not None:
                callback(epoch * n_batches + batch.index + 1, trainer.last)
    bar.close()
    if trainer is None:
        raise VitvizError("no image could be read: nothing to train on.")
    trainer.epoch, trainer.batch = settings.epochs, 0
    _write_checkpoint(trainer, run, [last_epoch.sums, last_epoch.n, problems], seen, path)
    final = last_epoch.result() or trainer.last
    final["dead_fraction"] = float(trainer.dead().float().mean())
    card = lens.loaded.card()
    sae.info = {
        "model": {"name": lens.spec.name, "label": lens.label, "checkpoint": lens.spec.checkpoint,
                  "img_size": lens.spec.img_size, "token_layout": card["token_layout"]},
        "point": point, "point_kind": settings.point, "layer": settings.layer,
        "layers": "layer is 1-based (as on the command line); the point name is 0-based",
        "tokens_read": "patch and prefix tokens" if settings.prefix else "patch tokens",
        "images": {"count": len(names) - len(problems), "names": names, "skipped": problems,
                   "sha256_of_names": run["images_sha256"]},
        "training": {**trainer.settings, **asdict(settings), "steps": trainer.step_count, "tokens": trainer.tokens},
        "metrics": final,
        "activations": seen.result(),
        "metrics_definition": "the last epoch's training batches, token-weighted (nmse = sum ||x - x_hat||^2 / "
                              "sum ||x - batch mean||^2 per step); dead_fraction: latents that fired on none of "
                              "the last dead_after tokens",
        "versions": versions(),
    }
    sae.to("cpu").save(out)
    return sae


def _trainer(sae: SAE, settings: TrainSettings) -> Trainer:
    return Trainer(sae, lr=settings.lr,
                   dead_after=16 * settings.batch_tokens if settings.dead_after is None else settings.dead_after)


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
    """Token-weighted means of the step metrics."""

    def __init__(self):
        self.sums, self.n = {}, 0

    def add(self, metrics: dict, n: int) -> None:
        for k in ("nmse", "explained_variance", "l0"):
            self.sums[k] = self.sums.get(k, 0.0) + metrics[k] * n
        self.n += n

    def result(self) -> dict:
        return {k: v / self.n for k, v in self.sums.items()} if self.n else {}


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
