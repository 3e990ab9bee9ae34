"""One layer's tokens of an image set written once to disk as float16 shards, and read back for training
(``features train --shards DIR``): the forwards run once, every later epoch and every later run with the same
model, point, layer, images and batch size read the shards instead.

``DIR/shards.json`` says what the shards hold (:data:`FORMAT`, the model, point, layer, prefix, batch size, the
images' names' SHA-256); ``DIR/shard-000000.safetensors`` is image batch 0 (0-based, ``batch_size`` consecutive
files of the input list): ``tokens`` (B, n, D) float16, with the batch's image names and bad files in its metadata.
Each shard is written whole or not at all, by the process that ran its forward (a Ray actor, on a file system
the nodes share, or a thread here), so a run killed while writing them continues with the missing ones.

float16 keeps 11 significant bits: a token read back is within 2^-11 of its value relatively (round to nearest,
unit roundoff u = 2^-11) when its magnitude is in float16's normal range [2^-14, 65504], and within 2^-25
absolutely below it. Tokens beyond 65504 would become infinite: such a layer is refused with a sentence.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..errors import VitvizError
from .data import TokenBatch, TokenWork, check_point

FORMAT = "vitviz-shards/1"
MANIFEST = "shards.json"
FLOAT16_MAX = 65504.0


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


class Shards:
    """The float16 shards of one run in ``folder`` (created).

    Args:
        run: what the tokens are (model, point, layer, prefix, batch size, images); a folder holding shards of
            another run is refused with a sentence.
        batches: how many image batches the run has.
    """

    def __init__(self, folder: str | Path, run: dict, batches: int):
        from ..io.atomic import atomic_write_bytes

        self.folder, self.batches = Path(folder), batches
        self.folder.mkdir(parents=True, exist_ok=True)
        manifest = self.folder / MANIFEST
        record = {"format": FORMAT, "dtype": "float16", "batches": batches, **run}
        if manifest.exists():
            held = json.loads(manifest.read_text())
            if held != record:
                keys = [k for k in record if held.get(k) != record[k]]
                raise VitvizError(f"{self.folder} holds the shards of other tokens ("
                                  + "; ".join(f"{k} {held.get(k)!r} there, {record[k]!r} now" for k in keys[:3])
                                  + "): give another --shards folder, or the same model, point, layer and images.")
        else:
            atomic_write_bytes(manifest, (json.dumps(record, indent=1) + "\n").encode())

    def missing(self) -> list[int]:
        """Batches without a shard yet (0-based)."""
        return [i for i in range(self.batches) if not (self.folder / shard_name(i)).exists()]

    def write(self, batch: TokenBatch, where: str) -> None:
        """One batch's tokens (B, n, D) as float16, whole or not at all (``where`` names the layer in the sentence)."""
        write_shard(self.folder, batch, where)

    def read(self, start: int = 0) -> Iterator[TokenBatch]:
        """The batches from ``start`` in order, tokens float32 (exactly the float16 values)."""
        from safetensors import safe_open

        for index in range(start, self.batches):
            path = self.folder / shard_name(index)
            try:
                with safe_open(str(path), framework="pt") as f:
                    meta, tokens = f.metadata(), f.get_tensor("tokens")
            except Exception as exc:  # safetensors raises its own error types for broken or missing files
                raise VitvizError(f"{path}: not readable as a shard ({exc}); delete the --shards folder to write "
                                  "it again.") from exc
            yield TokenBatch(index, json.loads(meta["names"]), tokens.float(), json.loads(meta["problems"]))


def write_shard(folder: Path, batch: TokenBatch, where: str) -> None:
    """``folder/shard-<index>.safetensors`` of one batch, whole or not at all; tokens beyond float16 are a sentence."""
    from safetensors.torch import save

    from ..io.atomic import atomic_write_bytes

    tokens = batch.tokens.detach()
    largest = float(tokens.abs().max()) if tokens.numel() else 0.0
    if largest > FLOAT16_MAX:
        raise VitvizError(f"{where} reaches {largest:.4g} in image batch {batch.index + 1}, beyond float16's "
                          f"largest value {FLOAT16_MAX:g}: train without --shards (the stream keeps float32).")
    meta = {"index": str(batch.index), "names": json.dumps(batch.names), "problems": json.dumps(batch.problems)}
    data = save({"tokens": tokens.to("cpu", torch.float16).contiguous()}, metadata=meta)
    atomic_write_bytes(Path(folder) / shard_name(batch.index), data)


@dataclass(frozen=True)
class ShardWork:
    """The per-batch function of :func:`write_shards` (:mod:`vitviz.runs.engines`): the batch's tokens, written as
    its shard where the forward ran — by the Ray actor (the folder on a file system every node shares: each node
    writes its own shards, and only a token count travels back), or here in the engine's finishing thread while the
    next batch runs through the model.

    Attributes:
        tokens: the tokens' per-batch function. folder: the shards folder. where: the layer, for the sentence.
    """

    tokens: TokenWork
    folder: str
    where: str

    def __call__(self, lens, batch) -> TokenBatch:
        return TokenBatch(batch.index, batch.names, self.tokens(lens, batch), batch.problems())

    def finish(self, value: TokenBatch) -> int:
        """Write the shard; the number of tokens it holds."""
        write_shard(Path(self.folder), value, self.where)
        return value.tokens.shape[0] * value.tokens.shape[1]


def write_shards(lens, files: list, point: str, layer: int, batch_size: int, prefix: bool, folder: str | Path,
                 run: dict, engine=None, progress: Callable[[int], None] | None = None) -> Shards:
    """Write the missing shards of ``files``' tokens at ``point`` of 1-based ``layer`` (through the engine: on Ray
    the actors write them, ``folder`` must be on a file system they share) and return the shards, complete.
    ``progress(batches written)`` after each, in file order."""
    from ..runs.engines import Engine, run_batches

    n_batches = -(-len(files) // batch_size)
    shards = Shards(folder, run, n_batches)
    missing = set(shards.missing())
    if missing:
        where = f"{point} of layer {layer} of {lens.label}"
        work = ShardWork(TokenWork(check_point(lens, point, layer), prefix), str(shards.folder.resolve()), where)
        done = [i for i in range(n_batches) if i not in missing]
        for count, batch in enumerate(run_batches(work, lens, files, batch_size, engine or Engine(), skip=done), 1):
            if batch.value is None:  # no file of the batch could be read: its shard is empty, as the stream's batch
                shards.write(TokenBatch(batch.index, batch.names, torch.zeros(0, 0, 0), batch.problems()), where)
            if progress is not None:
                progress(count)
    return shards
