"""One atomic writer: a file appears whole, with the user's umask, or not at all.

The bytes go to a temporary file in the target's own folder (a rename across file systems would not be
atomic), are flushed and fsynced, get the mode a plain ``open(path, "w")`` would give (``mkstemp`` makes
0600 files, which another account reading a shared output folder was refused), and are renamed into place
with SIGINT / SIGTERM held; the temporary is removed on every exit that does not rename it.
"""
from __future__ import annotations

import os
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_write_bytes", "signals_held", "umask_mode"]


@contextmanager
def signals_held():
    """Hold SIGINT/SIGTERM (delivered right after) so a rename, or a group of renames, is never cut in half."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def umask_mode(base: int = 0o666) -> int:
    """The mode a new file gets from ``open()`` under the process's umask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring). Returns the path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())
        with signals_held():
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
