#!/usr/bin/env bash
# Run the whole test suite; the first run creates .venv/ and installs what is missing.
# Extra arguments go to pytest (e.g. -k capture, -m "not slow", -n 0 for one process).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/ensure_venv.sh" --dev
cd "$root"
# Tests never use the network: the Hugging Face hub is offline for them.
export HF_HUB_OFFLINE=1
# Three test processes (pytest-xdist), each test file whole in one of them (its module fixtures built once):
# much of a test's time is waiting (a subprocess starting, a browser, a server), so three processes keep
# two cores busy where two left one idle about a third of the time (CI: 961 + 159 s CPU in 870 s of wall;
# -n 3 took 13 % less wall than -n 2 on the nine longest files, benchmarks/README.md).
# A later -n in the arguments wins (-n 0: one process, in file order). One torch thread
# per process (and per subprocess a test starts): workers with two threads each would ask more cores
# than there are, and OpenMP threads waiting on each other slow every test down.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$root/.venv/bin/python" -m pytest -n 3 --dist loadfile "$@"
