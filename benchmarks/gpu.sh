#!/usr/bin/env bash
# Every GPU figure in one call of at most five minutes (benchmarks/gpu.py: one table, then pytest -m gpu).
#   benchmarks/gpu.sh                    # the repository's .venv, else the machine's python3
#   OUT=dir benchmarks/gpu.sh            # also dir/gpu.md (the table) and dir/gpu.json (every record)
#   benchmarks/gpu.sh --device cpu --small
# gpu.py keeps its own time box (--budget, 280 s); timeout is the backstop at 300 s.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec timeout --signal=TERM --kill-after=10 300 env HF_HUB_OFFLINE=1 "$PY" -u benchmarks/gpu.py "$@"
