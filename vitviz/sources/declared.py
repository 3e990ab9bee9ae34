"""What a file declares it will take, read before anything is built or read whole.

A few bytes can declare gigabytes: a 600-byte transformers ``config.json`` declaring a 39e9-parameter
ViT (``from_pretrained`` builds the whole model before it looks at the weights), a 7 MB Parquet file
whose footer declares 200 M run-length-encoded rows, a settings JSON of a gigabyte. Each is sized here
from its header alone (config fields, a timm architecture built on the ``meta`` device, a checkpoint's
index, a Parquet footer, a file's length) so the caller can refuse it with a sentence before
allocating anything. Checkpoint indexes themselves are read by :mod:`vitviz.sources.checkpoints`.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, VitvizError, first_line
from ..settings import Settings, megabytes
from .names import parse_model_name

# JSON settings, configs and summaries vitviz reads are kilobytes; parsing takes ~2-10x the text in
# Python objects, so a file past this is refused before it is read.
MAX_JSON_BYTES = 16 << 20
# Python's own objects per transformer block (modules, their dicts, parameter wrappers): measured
# about 30 KiB per transformers ViTLayer with tracemalloc; counted so that a config declaring
# millions of tiny layers is sized by what building it costs.
LAYER_OBJECT_BYTES = 32 << 10
FLOAT32 = 4


@dataclass(frozen=True)
class Declared:
    """A declared size.

    Attributes:
        bytes: what it takes once built or read (a lower bound: a caller refuses when even this is too much).
        what: where it is declared, for a sentence (``"its config.json (3.9e+10 parameters in 12 blocks, as float32)"``).
    """

    bytes: int
    what: str


def check_json_size(path: Path, what: str | None = None, max_bytes: int = MAX_JSON_BYTES) -> None:
    """Refuse a JSON file larger than ``max_bytes`` before anything parses it (no-op for a missing file).

    ``what``: the file as the sentence names it (default its path).

    Raises:
        VitvizError: a sentence naming the file, its size and the limit.
    """
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size > max_bytes:
        raise VitvizError(f"{what or path}: it is {megabytes(size)}, more than the {megabytes(max_bytes)} a JSON "
                          "file of vitviz's may take; vitviz does not read it.")


# ---------------------------------------------------------------------------------------------
# Models


def _int(config: dict, *keys: str, default: int = 0) -> int:
    """The first of ``keys`` that holds a number (or a list of numbers: their sum, e.g. Swin's ``depths``)."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
            return max(int(value), 0)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
            return max(int(sum(value)), 0)
    return default


def _side(config: dict, key: str, default: int) -> int:
    value = config.get(key)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return max(int(value[0]), 1)
    return max(_int(config, key, default=default), 1)


def _tower_params(config: dict) -> tuple[int, int]:
    """(parameters, blocks) of one transformer tower of a config: a lower bound from its sizes.

    Per block: q, k, v and output projections (4·D² + 4·D), the MLP (2·D·I + I + D) and two norms (4·D);
    the patch embedding C·P²·D + D, one position row per patch and a class token; a text tower's
    vocabulary; a classifier head of ``num_labels`` rows. Families with more (layer scale, registers,
    relative bias) have more parameters, never fewer.
    """
    hidden = _int(config, "hidden_size", "embed_dim", "d_model", "hidden_dim")
    blocks = _int(config, "num_hidden_layers", "num_layers", "depths", "depth")
    mlp_ratio = config.get("mlp_ratio") if isinstance(config.get("mlp_ratio"), (int, float)) else 4
    inter = _int(config, "intermediate_size", "mlp_dim", default=int(max(mlp_ratio, 0) * hidden))
    per_block = 4 * hidden * hidden + 4 * hidden + 2 * hidden * inter + inter + hidden + 4 * hidden
    patch = _side(config, "patch_size", 16)
    image = _side(config, "image_size", 0) if "image_size" in config else 0
    channels = _int(config, "num_channels", default=3)
    embed = channels * patch * patch * hidden + hidden + ((image // patch) ** 2 + 1) * hidden if image else 0
    text = (_int(config, "vocab_size") + _int(config, "max_position_embeddings")) * hidden
    labels = config.get("id2label")
    classes = len(labels) if isinstance(labels, dict) else _int(config, "num_labels")
    return blocks * per_block + embed + text + classes * hidden, blocks


def hf_config_declared(config: dict, where: str) -> Declared:
    """The float32 bytes and Python objects a transformers config declares (vision and text towers)."""
    towers = [c for c in (config.get("vision_config"), config.get("text_config")) if isinstance(c, dict)] or [config]
    params = blocks = 0
    for tower in towers:
        p, b = _tower_params(tower)
        params, blocks = params + p, blocks + b
    return Declared(params * FLOAT32 + blocks * LAYER_OBJECT_BYTES,
                    f"its {where} ({params:.3g} parameters in {blocks} blocks, as float32)")


def hf_files(name: str) -> dict[str, Path]:
    """The files of a transformers folder or cached hub id that vitviz's loader reads, as they are on disk.

    Only files already on disk: a hub id not cached yet has none (its sizes are checked once the
    loader has them in the cache, on the next load).
    """
    source = parse_model_name(name)
    names = ("config.json", "preprocessor_config.json", "model.safetensors", "model.safetensors.index.json",
             "pytorch_model.bin")
    if source.folder is not None:
        return {n: source.folder / n for n in names if (source.folder / n).is_file()}
    if source.hub_id:
        from huggingface_hub import try_to_load_from_cache

        found = {}
        for n in names:
            try:
                path = try_to_load_from_cache(source.hub_id, n)
            except Exception:  # noqa: BLE001 - a malformed id: the loader says so
                return {}
            if isinstance(path, str):
                found[n] = Path(path)
        return found
    return {}


def hf_declared(name: str) -> list[Declared]:
    """What a transformers model's files declare: its config's parameters and its weights' unpacked size.

    Raises:
        VitvizError: a JSON file too large to read; ModelError: a weights index that is damaged.
    """
    from .checkpoints import declared_bytes

    files = hf_files(name)
    for n, path in files.items():
        if n.endswith(".json"):
            check_json_size(path, f"Model {name!r}: its {n}")
    declared = []
    if "config.json" in files:
        try:
            config = json.loads(files["config.json"].read_text())
        except (OSError, ValueError):
            config = None  # the loader says why
        if isinstance(config, dict):
            declared.append(hf_config_declared(config, "config.json"))
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if weights in files:
            declared.append(Declared(declared_bytes(files[weights]), f"its {weights} (unpacked)"))
    if "model.safetensors.index.json" in files:
        try:
            total = json.loads(files["model.safetensors.index.json"].read_text())["metadata"]["total_size"]
            declared.append(Declared(int(total), "its model.safetensors.index.json (all shards)"))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # the loader says why
    return declared


@functools.lru_cache(maxsize=64)
def timm_declared(arch: str, img_size: int | None = None) -> Declared | None:
    """The float32 bytes of a timm architecture's parameters, counted on the ``meta`` device (no memory).

    None when timm has no such model or cannot build it with ``img_size`` (the loader says why).
    """
    import timm
    import torch

    if not timm.is_model(arch):
        return None
    try:
        with torch.device("meta"):
            model = timm.create_model(arch, pretrained=False, **({"img_size": img_size} if img_size else {}))
    except Exception:  # noqa: BLE001 - the loader reports an architecture timm cannot build
        return None
    params = sum(t.numel() for t in model.state_dict().values())
    return Declared(params * FLOAT32, f"timm's architecture ({params:.3g} parameters, as float32)")


def check_weights(name: str, limit_bytes: int | None = None, img_size: int | None = None) -> None:
    """Refuse a model whose declared size (config, architecture, weights index) exceeds ``limit_bytes``,
    before anything is built: transformers' ``from_pretrained`` builds the whole model from its config
    before it notices that the weights do not fit it (see :mod:`vitviz.sources.declared`).

    Args:
        name: ``"bundled"``, a timm model name, a transformers folder / ``hf:`` hub id or ``torchvision:`` builder.
        limit_bytes: the memory budget; None: ``VITVIZ_CACHE_MB``, else the machine's memory (``analyze``'s).
        img_size: the requested input resolution (a timm position table grows with it).

    Raises:
        ModelError: a sentence naming the model, the declared size and the budget.
    """
    if limit_bytes is None:
        limit_bytes = Settings.from_env(memory_share=1.0).cache_bytes
    source = parse_model_name(name)
    if source.kind == "bundled":
        return  # shipped with vitviz: 22 M parameters
    if source.kind == "transformers":
        try:
            found = hf_declared(name)
        except ModelError:
            raise
        except VitvizError as exc:
            raise ModelError(str(exc)) from exc
    elif source.kind == "torchvision":
        from .torchvision_models import declared_bytes

        size = declared_bytes(name, img_size)
        found = [Declared(size, f"torchvision's architecture ({size // FLOAT32:.3g} parameters, as float32)")] \
            if size else []
    else:
        arch = timm_declared(name, img_size)
        found = [arch] if arch else []
    for item in found:
        if item.bytes > limit_bytes:
            raise ModelError(f"Model {name!r}: {item.what} declares {megabytes(item.bytes)}, over this server's "
                             f"memory budget of {megabytes(limit_bytes)} (VITVIZ_CACHE_MB); nothing was built or read.")


# ---------------------------------------------------------------------------------------------
# Parquet tables

# A stats or sinks row in memory: two dictionary-coded text columns (int32 codes), two int32 and up
# to five float64 columns are 56 bytes in Arrow and again in pandas; the checks after reading
# (duplicates over four keys, dtype conversion) hold about two more copies. 256 bytes per row is
# that, rounded up: 10 000 images of ViT-B (1.4 M rows) are 360 MiB.
PARQUET_ROW_BYTES = 256
# A Parquet footer (schema, row-group index, key-value metadata) of a vitviz table is kilobytes.
MAX_PARQUET_FOOTER = 16 << 20


def parquet_metadata(source, name: str):
    """A Parquet file's footer (``pyarrow.parquet.FileMetaData``), its length checked before it is parsed.

    ``source``: a path, or a seekable binary file (an upload's ``io.BytesIO``).

    Raises:
        VitvizError: a footer larger than :data:`MAX_PARQUET_FOOTER` (a sentence naming the file).
        pyarrow.ArrowException, OSError: not a Parquet file (the caller says so).
    """
    import pyarrow.parquet as pq

    handle = open(source, "rb") if isinstance(source, (str, Path)) else source
    try:
        handle.seek(0, 2)
        size = handle.tell()
        if size >= 12:
            handle.seek(size - 8)
            tail = handle.read(8)
            footer = int.from_bytes(tail[:4], "little")
            if tail[4:] == b"PAR1" and footer > MAX_PARQUET_FOOTER:
                raise VitvizError(f"{name}: its Parquet footer declares {megabytes(footer)} of metadata, more than "
                                  f"the {megabytes(MAX_PARQUET_FOOTER)} a vitviz table has; vitviz does not read it.")
        handle.seek(0)
        return pq.ParquetFile(handle).metadata
    finally:
        if handle is not source:
            handle.close()


def parquet_declared(metadata, row_bytes: int = PARQUET_ROW_BYTES) -> Declared:
    """What reading a Parquet table whole takes, from its footer: rows x ``row_bytes``, or the columns'
    declared uncompressed sizes when larger (a long string stored once, compressed)."""
    columns = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups))
    rows = metadata.num_rows
    return Declared(max(rows * row_bytes, columns),
                    f"its footer declares {rows:,} rows ({megabytes(columns)} of column data), which take")


def check_parquet(source, name: str, limit_bytes: int, largest_group_only: bool = False):
    """Refuse a Parquet table whose footer declares more than ``limit_bytes`` in memory; returns the footer.

    Args:
        source: a path or a seekable binary file.
        name: the file as the user knows it, for the sentence.
        limit_bytes: the memory budget.
        largest_group_only: the reader streams row group by row group, so only the largest group must fit.

    Raises:
        VitvizError: a sentence naming the file, the declared size and the budget.
    """
    metadata = parquet_metadata(source, name)
    found = parquet_declared(metadata)
    if largest_group_only and metadata.num_row_groups:
        groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
        largest = max(groups, key=lambda g: max(g.num_rows * PARQUET_ROW_BYTES, g.total_byte_size))
        found = Declared(max(largest.num_rows * PARQUET_ROW_BYTES, largest.total_byte_size),
                         f"one of its row groups declares {largest.num_rows:,} rows, which take")
    if found.bytes > limit_bytes:
        raise VitvizError(f"{name}: {found.what} {megabytes(found.bytes)} in memory, over this server's memory "
                          f"budget of {megabytes(limit_bytes)} (VITVIZ_CACHE_MB); vitviz does not read it.")
    return metadata


def open_user_table(source, file_name: str, command: str, name: str | None = None, limit_bytes: int | None = None):
    """A table a user gave, opened for reading once its footer passed :func:`check_parquet`.

    Args:
        source: the file's bytes (an upload), a path to it, or the ``--out`` folder holding ``file_name``.
        file_name: the file ``python -m vitviz COMMAND --out DIR`` writes (``stats.parquet``, ``auc.parquet``).
        command: that command, for the sentence.
        name: the file as the user knows it (default: the path, or ``file_name`` for bytes).
        limit_bytes: the memory budget; None: the server's (``VITVIZ_CACHE_MB``).

    Returns:
        (a seekable source, its footer, the name).

    Raises:
        VitvizError: absent, not Parquet, or declaring more than the budget (a sentence naming the file).
    """
    import io

    import pyarrow as pa

    if not isinstance(source, bytes):
        path = Path(source).expanduser()
        path = path / file_name if path.is_dir() else path
        name = name or str(path)
        if not path.is_file():
            article = "an" if file_name[0] in "aeiou" else "a"
            raise VitvizError(f"{name}: no such file; give {article} {file_name} file or the folder "
                              f"`python -m vitviz {command} --out` wrote it to.")
        source = path
    name = name or file_name.replace(".parquet", " table")
    limit = Settings.from_env().cache_bytes if limit_bytes is None else limit_bytes
    opened = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        return opened, check_parquet(opened, name, limit), name
    except (pa.ArrowException, OSError) as exc:
        raise VitvizError(f"{name}: not a Parquet file ({first_line(exc)}); expected the {file_name} that "
                          f"`python -m vitviz {command} --out DIR` writes.") from exc
