#!/usr/bin/env bash
# Start the vitviz app; the first run creates .venv/ and installs what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/ensure_venv.sh"
cd "$root"
exec "$root/.venv/bin/python" -m streamlit run app.py "$@"
