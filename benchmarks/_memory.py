"""Peak resident memory of a block of code, on Linux: reset the high-water mark, run, read it."""
from __future__ import annotations

from pathlib import Path


def _read_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_mib(fn) -> float:
    """Peak RSS while ``fn()`` runs minus the RSS before it, in MiB (VmHWM reset via clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _read_kib("VmRSS")
    fn()
    return (_read_kib("VmHWM") - before) / 1024
