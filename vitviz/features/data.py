"""One layer's tokens of an image set, streamed batch by batch through :meth:`vitviz.Lens.trace` (never all in
memory): what SAEs are trained on and read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import VitvizError

# Block points whose value is one D-vector per token (B, N, D) — what an SAE reads.
TOKEN_POINTS = ("resid_pre", "ln1", "attn_out", "resid_mid", "ln2", "mlp_hidden", "mlp_out", "resid_post")


@dataclass(frozen=True)
class TokenBatch:
    """One batch of images' tokens at one point.

    Attributes:
        index: 0-based batch number (batches are ``batch_size`` consecutive files of the input list).
        names: the images decoded in this batch (bad files are left out, and listed in ``problems``).
        tokens: (B, n, D) float32 on the model's device; n = the patch tokens (raster order), after the prefix
            tokens when those are included.
        problems: one sentence per file of this batch that could not be decoded.
    """

    index: int
    names: list[str]
    tokens: torch.Tensor
    problems: list[str]


def check_point(lens, point: str, layer: int) -> str:
    """The adapters' name of ``point`` at 1-based ``layer`` (``"blocks.5.resid_post"`` for layer 6), or a sentence."""
    if lens.scope != "global":
        raise VitvizError(f"{lens.label} attends inside windows (its tokens are on changing stage grids): SAEs here "
                          "read models whose blocks keep one token sequence (ViT, DeiT, DINO, CLIP, SigLIP, ...).")
    if point not in TOKEN_POINTS:
        raise VitvizError(f"--point {point!r} is not one vector per token: choose from {', '.join(TOKEN_POINTS)}.")
    if not 1 <= layer <= lens.num_layers:
        raise VitvizError(f"--layer {layer} is out of range: {lens.label} has layers 1 to {lens.num_layers} "
                          "(1-based on the command line).")
    return f"blocks.{layer - 1}.{point}"


def select_tokens(values: torch.Tensor, layout, prefix: bool) -> torch.Tensor:
    """(B, N, D) -> (B, n, D): the patch tokens, with the prefix tokens before them when ``prefix``."""
    return values if prefix else values[:, layout.patch_slice]


@dataclass(frozen=True)
class TokenWork:
    """The per-batch function (:mod:`vitviz.runs.engines`): a batch's tokens at ``point``, the forward stopped there.

    Attributes:
        point: the adapters' name (``"blocks.5.resid_post"``). prefix: keep the prefix tokens too.
    """

    point: str
    prefix: bool = False

    def __call__(self, lens, batch) -> torch.Tensor:
        trace = lens.trace(batch.x, keep=[self.point], stop_after=self.point)
        return select_tokens(trace[self.point], trace.layout, self.prefix).float()


def token_batches(lens, files: Sequence, point: str, layer: int, batch_size: int, prefix: bool = False,
                  start: int = 0, engine=None, skip: Sequence[int] = ()) -> Iterator[TokenBatch]:
    """Tokens of ``files`` at ``point`` of 1-based ``layer``, ``batch_size`` files per forward, from batch ``start``.

    Each forward stops right after the point (later blocks are not computed) and runs under inference mode.

    Args:
        files: :class:`vitviz.io.inputs.ImageFile` (``.path``, ``.name``) or paths.
        prefix: include the prefix tokens (CLS, registers) as well as the patches.
        start: the first batch to compute (earlier ones are skipped without decoding: resuming).
        skip: other batches (0-based) not to compute.
        engine: where the forwards run (:class:`vitviz.runs.engines.Engine`; default this process). On Ray the
            tokens come back to this process on the CPU.
    """
    from ..runs.engines import Engine, run_batches

    work = TokenWork(check_point(lens, point, layer), prefix)
    for batch in run_batches(work, lens, files, batch_size, engine or Engine(), skip=[*range(start), *skip]):
        tokens = torch.zeros(0, 0, 0) if batch.value is None else batch.value
        yield TokenBatch(batch.index, batch.names, tokens, batch.problems())


def flat(tokens: torch.Tensor) -> torch.Tensor:
    """(B, n, D) -> (B * n, D)."""
    return tokens.reshape(-1, tokens.shape[-1])


def shuffled(tokens: torch.Tensor, seed: int, epoch: int, batch: int) -> torch.Tensor:
    """The rows of (m, D) in an order that is a function of (seed, epoch, batch) only (resuming reproduces it)."""
    order = np.random.default_rng([int(seed), int(epoch), int(batch)]).permutation(len(tokens))
    return tokens[torch.from_numpy(order).to(tokens.device)]
