"""One writer per output folder: ``with output_lock(args.out, "analyze"):`` before a command computes anything.

Two runs writing one folder lose work: the second removes the first's parts folder or renames its tables
over the first's. The lock is an operating-system file lock (:mod:`filelock`: ``flock`` on Linux) on
``DIR/.vitviz-lock``. The kernel drops it when its process ends, however it ends, so a ``kill -9``'d run
never keeps a folder locked. Beside it a JSON sidecar, ``DIR/.vitviz-lock.json``, says who holds it: pid,
host, command, start time and a heartbeat that a daemon thread renews every :data:`HEARTBEAT_S` seconds.

- A second run takes nothing and raises :class:`OutputBusy` at once, naming the first run's pid and start.
- A run that takes the lock and finds a sidecar left behind (the run that wrote it was killed before it
  could remove it: its pid is gone, or belongs to another process now, its heartbeat long past) takes over
  with a note.
- Leaving the ``with`` block (done, an error, Ctrl-C, SIGTERM raised as KeyboardInterrupt) removes both
  files: the folder holds only the run's results.

The lock is per process and thread: a writer nested inside a command that already holds the folder (a
store opened inside ``analyze``) passes through; another thread of the same process is refused like
another process.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from ..errors import VitvizError
from .output import check_writable

LOCK_NAME = ".vitviz-lock"
SIDECAR_NAME = ".vitviz-lock.json"
HEARTBEAT_S = 10.0
# A sidecar whose heartbeat is older than this was left by a run that no longer renews it.
STALE_S = 3 * HEARTBEAT_S
_READ_SIDECAR_S = 1.0  # how long a refused run waits for a just-started holder to write its sidecar
_ORPHAN_WAIT_S = 3.0

_held: dict[Path, tuple[int, int]] = {}  # resolved folder -> (thread id, depth)
_held_guard = threading.Lock()


class OutputBusy(VitvizError):
    """Another run is writing the output folder; the message names it and what to do."""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another account's process
        return True
    return True


def holder_alive(record: dict, now: float | None = None) -> bool:
    """Whether the run a sidecar ``record`` describes may still be running: on this host, its pid runs and its
    heartbeat is recent; on another host (a shared folder), its heartbeat is recent."""
    now = time.time() if now is None else now
    fresh = now - float(record.get("heartbeat", 0)) <= STALE_S
    if record.get("host") == socket.gethostname():
        return fresh and _pid_runs(int(record.get("pid", -1)))
    return fresh


def read_sidecar(folder: Path) -> dict | None:
    """The sidecar of ``folder``'s lock, or None when there is none or it cannot be read (being replaced)."""
    try:
        record = json.loads((Path(folder) / SIDECAR_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_sidecar(folder: Path, record: dict) -> None:
    """Renamed into place (a reader never sees half of it) but not fsynced as :mod:`vitviz.io.atomic` does: the
    sidecar only tells who holds the OS lock, which a crash takes with it (the fsync cost 5-11 ms a run here)."""
    tmp = folder / f"{SIDECAR_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, folder / SIDECAR_NAME)


def _busy(folder: Path, record: dict | None) -> OutputBusy:
    if record is None:
        who = "another run"
    else:
        who = (f"another run (pid {record.get('pid')}"
               + (f" on {record['host']}" if record.get("host") not in (None, socket.gethostname()) else "")
               + f", started at {_when(float(record.get('started', 0)))})")
    return OutputBusy(f"{folder} is being written by {who}; wait for it or choose another --out.")


def _holder_of(folder: Path) -> dict | None:
    """The live holder's sidecar; a holder that has just taken the lock gets a moment to write it."""
    deadline = time.monotonic() + _READ_SIDECAR_S
    while True:
        record = read_sidecar(folder)
        if (record is not None and holder_alive(record)) or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


def _locked_here(lock: FileLock, lock_path: Path) -> bool:
    """Whether the file this process locked is still ``lock_path`` (a holder removes it on release: a run that
    opened it just before then holds a file nobody else will ever open)."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    try:
        return os.path.samestat(os.fstat(fd), os.stat(lock_path)) if fd is not None else lock_path.exists()
    except OSError:
        return False


def _acquire(folder: Path, lock_path: Path) -> FileLock:
    """The folder's OS lock, taken without waiting; :class:`OutputBusy` when a live run holds it.

    A holder whose sidecar says it is gone (a worker process it forked may keep the lock a moment after it
    was killed) gets :data:`_ORPHAN_WAIT_S` to let go.
    """
    deadline = None
    for _ in range(100):  # a file removed under this run is taken again at once; never more than a few times
        lock = FileLock(str(lock_path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            record = _holder_of(folder)
            if record is None or holder_alive(record):
                raise _busy(folder, record) from None
            deadline = deadline or time.monotonic() + _ORPHAN_WAIT_S
            if time.monotonic() > deadline:
                raise OutputBusy(f"{folder} is still held by a process of a run that ended (pid {record.get('pid')}, "
                                 f"started at {_when(float(record.get('started', 0)))}), a worker it started; wait "
                                 "for it to exit or choose another --out.") from None
            time.sleep(0.1)
            continue
        if _locked_here(lock, lock_path):
            return lock
        lock.release()
    raise OutputBusy(f"{folder}: the lock file {LOCK_NAME} kept changing under this run; another program is "
                     "removing it. Choose another --out.")


class _Heartbeat(threading.Thread):
    def __init__(self, folder: Path, record: dict):
        super().__init__(name=f"vitviz-lock-heartbeat {folder}", daemon=True)
        self.folder, self.record, self.stop = folder, record, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            self.record["heartbeat"] = time.time()
            try:
                _write_sidecar(self.folder, self.record)
            except OSError:  # a full disk stops the heartbeat, not the run; the OS lock still holds
                pass


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


@contextmanager
def output_lock(folder: Path | str, command: str, note: Callable[[str], None] = _note) -> Iterator[Path]:
    """Hold ``folder`` for one writer for the ``with`` block; create it if needed.

    Args:
        folder: the output folder (``--out``).
        command: what is writing it (``"analyze"``), recorded in the sidecar.
        note: where the takeover note goes (stderr by default).

    Raises:
        OutputBusy: another run (or thread) holds the folder; raised at once, before anything is written.
        VitvizError: the folder cannot be created or written.
    """
    folder = Path(folder)
    check_writable(folder)
    key, me = folder.resolve(), threading.get_ident()
    with _held_guard:
        holder, depth = _held.get(key, (me, 0))
        if depth and holder != me:
            raise _busy(folder, read_sidecar(folder))
        if depth:
            _held[key] = (me, depth + 1)
    if depth:  # this thread already holds it: a nested writer
        try:
            yield folder
        finally:
            with _held_guard:
                _held[key] = (me, _held[key][1] - 1)
        return

    lock_path = folder / LOCK_NAME
    lock = _acquire(folder, lock_path)
    try:
        left = read_sidecar(folder)
        if left is not None:
            note(f"took over {folder} from a run that stopped without releasing it (pid {left.get('pid')}, "
                 f"{left.get('command', 'a command')}, started at {_when(float(left.get('started', 0)))}, last "
                 f"heartbeat {_when(float(left.get('heartbeat', 0)))}); its unfinished files are treated as "
                 "that command always treats them.")
        now = time.time()
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": now,
                  "heartbeat": now, "heartbeat_s": HEARTBEAT_S}
        _write_sidecar(folder, record)
        with _held_guard:
            _held[key] = (me, 1)
        beat = _Heartbeat(folder, record)
        beat.start()
        try:
            yield folder
        finally:
            beat.stop.set()
            beat.join()
            with _held_guard:
                _held.pop(key, None)
            # Removed while still held, sidecar first: a run that sees no sidecar and gets the lock takes no note.
            for name in (SIDECAR_NAME, LOCK_NAME):
                try:
                    (folder / name).unlink()
                except FileNotFoundError:
                    pass
    finally:
        lock.release()
