"""What a checkpoint file will take in memory, read from its index before anything is unpacked.

``torch.load(weights_only=True)`` refuses code, not size: a 2 MB ``.pth`` of compressed zeros
unpacks to gigabytes. A PyTorch file is a zip whose central directory declares every record's
uncompressed size; a safetensors file starts with a JSON header giving every tensor's byte
range. Both are read here without decompressing or loading anything.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from .errors import ModelError, first_line

MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


def declared_bytes(path: Path) -> int:
    """Bytes a checkpoint's contents take once unpacked, from its index; the file size for other formats.

    Raises:
        ModelError: the index is damaged or inconsistent (a sentence naming the file).
    """
    size = path.stat().st_size
    if path.suffix.lower() == ".safetensors":
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"Checkpoint {path.name}: it could not be read (too short for a safetensors file: "
                                 f"{size} bytes).")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > min(MAX_SAFETENSORS_HEADER, size - 8):
                raise ModelError(f"Checkpoint {path.name}: it could not be read (its safetensors header claims "
                                 f"{header_len} bytes, more than the file holds: {size} bytes).")
            try:
                header = json.loads(f.read(header_len))
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ModelError(f"Checkpoint {path.name}: it could not be read (its safetensors header: "
                                 f"{first_line(exc)}).") from exc
        return max(ends, default=0) + header_len + 8
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                return sum(info.file_size for info in archive.infolist())
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ModelError(f"Checkpoint {path.name}: it could not be read (its zip index: "
                             f"{first_line(exc)}).") from exc
    return size
