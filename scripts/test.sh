#!/usr/bin/env bash
# Run the whole test suite; the first run creates .venv/ and installs what is missing.
# Extra arguments go to pytest (e.g. -k capture, -m "not slow").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/ensure_venv.sh" --dev
cd "$root"
# Tests never use the network: the Hugging Face hub is offline for them.
export HF_HUB_OFFLINE=1
exec "$root/.venv/bin/python" -m pytest "$@"
