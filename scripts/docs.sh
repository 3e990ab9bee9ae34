#!/usr/bin/env bash
# Build the documentation site (MkDocs + Material + mkdocstrings) into site/ and say where to open it.
#   scripts/docs.sh            build once, strictly: any warning (a broken link, a missing picture) fails
#   scripts/docs.sh serve      serve it with live reload on http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure_venv.sh --dev >/dev/null
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 NO_MKDOCS_2_WARNING=1
if [[ "${1:-}" == "serve" ]]; then
    exec .venv/bin/python -m mkdocs serve
fi
site="${SITE_DIR:-site}"  # SITE_DIR: elsewhere (the test builds into a temporary folder)
.venv/bin/python -m mkdocs build --strict --site-dir "$site"
echo "Documentation built: open file://$(cd "$site" && pwd)/index.html (or run: scripts/docs.sh serve)"
