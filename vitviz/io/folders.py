"""Output folders: made if needed and proved writable before any work, or a sentence saying why not."""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import VitvizError


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written in it; a sentence otherwise."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".vitviz-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise VitvizError(f"Cannot write the output folder --out {folder}: {reason}. "
                          "Pick a folder you can write to.") from exc
