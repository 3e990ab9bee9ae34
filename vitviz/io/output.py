"""The files of one ``analyze`` run: streamed to disk batch by batch, renamed into place whole.

Arrays are appended per batch to raw files in a hidden folder inside the output folder (plain
writes, no memory maps, so the process's memory does not grow with the image count), then
assembled into an ``.npz`` entry by entry (the layout ``np.savez`` writes) and renamed into
place together with ``settings.json``. An interrupted run leaves the previous result as it was;
both files carry the run's id (settings ``run_id``, the npz's zip comment) so a reader can check
that they belong together.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path

import numpy as np

from ..errors import VitvizError
from .atomic import signals_held

NPZ_NAME = "analysis.npz"
SETTINGS_NAME = "settings.json"
_CHUNK = 16 << 20


def versions(*extra: str) -> dict:
    """The versions settings.json records: vitviz, timm, torch, Python, and ``extra`` distributions."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import timm
    import torch

    from .. import __version__

    found = {"vitviz": __version__, "timm": timm.__version__, "torch": torch.__version__}
    for name in extra:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found | {"python": platform.python_version()}


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written in it; a sentence otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".vitviz-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise VitvizError(f"Cannot write the output folder --out {folder}: {reason}. "
                          "Pick a folder you can write to.") from exc


def run_id_of(npz_path: Path) -> str:
    """The run id stored in an analysis.npz written by :class:`RunOutput` (its zip comment)."""
    with zipfile.ZipFile(npz_path) as zf:
        return zf.comment.decode()


class NpzStream:
    """Arrays whose first axis grows batch by batch, kept on disk until assembled into an npz.

    Args:
        folder: where the raw per-array files go.
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.rows: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}
        self.whole: dict[str, np.ndarray] = {}

    def append(self, arrays: dict[str, np.ndarray]) -> None:
        """Append one batch: every array (b, ...) with the same trailing shape and dtype each time."""
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            dtype, shape, count = self.rows.get(name, (a.dtype, a.shape[1:], 0))
            if (a.dtype, a.shape[1:]) != (dtype, shape):
                raise ValueError(f"{name}: batch of {a.dtype} {a.shape[1:]} after {dtype} {shape}")
            with open(self.folder / f"{name}.raw", "ab") as f:
                f.write(memoryview(a).cast("B"))
            self.rows[name] = (dtype, shape, count + len(a))

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """Arrays written as they are (small, run-wide ones)."""
        self.whole.update(arrays)

    def shapes(self) -> dict[str, list[int]]:
        return ({name: [count, *shape] for name, (_, shape, count) in self.rows.items()}
                | {name: list(a.shape) for name, a in self.whole.items()})

    def write(self, path: Path, comment: str) -> None:
        """Assemble every array into the npz ``path``, one zip entry after another, no array in memory."""
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.comment = comment.encode()
            for name, (dtype, shape, count) in self.rows.items():
                with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array_header_1_0(
                        f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                            "shape": (count, *shape)})
                    with open(self.folder / f"{name}.raw", "rb") as raw:
                        shutil.copyfileobj(raw, f, _CHUNK)
            for name, a in self.whole.items():
                with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)



class RunOutput:
    """One run's files, written under a hidden folder inside ``folder`` and renamed into place by :meth:`commit`.

    Use as a context manager: leaving it without a commit (an error, Ctrl-C) removes every
    temporary file and leaves ``folder`` as it was.

    Args:
        folder: the output folder (must exist and be writable; see :func:`check_writable`).
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.run_id = uuid.uuid4().hex
        self.tmp = folder / f".vitviz-run-{self.run_id}.partial"
        self.tmp.mkdir()
        self.arrays = NpzStream(self.tmp)
        self.extra: list[str] = []

    def file(self, name: str) -> Path:
        """A temporary path for one more file (a report PNG) that :meth:`commit` moves to ``folder/name``."""
        self.extra.append(name)
        return self.tmp / name

    def commit(self, settings: dict) -> None:
        """Write the npz and settings.json (with ``run_id``) and rename them, then the other files, into place."""
        npz, js = self.tmp / NPZ_NAME, self.tmp / SETTINGS_NAME
        self.arrays.write(npz, self.run_id)
        js.write_text(json.dumps({"run_id": self.run_id} | settings, indent=2, default=str))
        with signals_held():
            os.replace(npz, self.folder / NPZ_NAME)
            os.replace(js, self.folder / SETTINGS_NAME)
            for name in self.extra:
                os.replace(self.tmp / name, self.folder / name)

    def __enter__(self) -> "RunOutput":
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
