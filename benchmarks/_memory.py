"""Peak resident memory of a block of code, on Linux: reset the high-water mark, run, read it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CLI = ("import sys, json; from vitviz.cli import main; rc = main(json.loads(sys.argv[1])); "
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
        "print('HWM', hwm); sys.exit(rc)")


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


def cli_in_fresh_process(args: list[str]) -> tuple[float, int, str]:
    """``python -m vitviz ARGS`` in a fresh process: (wall seconds, its VmHWM in KiB, stderr).

    Raises RuntimeError with the end of stderr when the command fails.
    """
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", _CLI, json.dumps(args)], capture_output=True, text=True, cwd=ROOT,
                            env=os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return wall, int(result.stdout.split("HWM")[-1]), result.stderr
