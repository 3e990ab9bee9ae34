#!/usr/bin/env bash
# Run the whole test suite; the first run creates .venv/ and installs what is missing.
# Extra arguments go to pytest (e.g. -k capture, -m "not slow", -n 0 for one process).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/ensure_venv.sh" --dev
cd "$root"
# Tests never use the network: the Hugging Face hub is offline for them.
export HF_HUB_OFFLINE=1
# Two test processes (pytest-xdist), each test file whole in one of them (its module fixtures built once):
# much of a test's time is waiting (a subprocess starting, a browser, a server), so two processes share
# two cores well. A later -n in the arguments wins (-n 0: one process, in file order). One torch thread
# per process (and per subprocess a test starts): two workers with two threads each would ask four cores
# of two, and OpenMP threads waiting on each other slow every test down.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$root/.venv/bin/python" -m pytest -n 2 --dist loadfile "$@"
