"""Counts and sizes in words, for every sentence vitviz writes (figures, CLI lines, errors): "1 image", "3 patches",
"46.0 KB"."""
from __future__ import annotations

__all__ = ["counted", "file_size"]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, singular for exactly one: ``counted(1, "image")`` -> "1 image", ``counted(3, "patch")`` ->
    "3 patches"; ``plural`` where adding "s" or "es" is wrong."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or noun + ('es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's')}"


def file_size(n_bytes: int) -> str:
    """A file's size as a browser's uploader writes it (decimal units, one decimal): ``file_size(46_021)`` ->
    "46.0 KB", ``file_size(2_500_000)`` -> "2.5 MB"; "0.0 MB" for a photo of 46 KB said nothing."""
    if n_bytes < 1000:
        return counted(n_bytes, "byte")
    for unit, scale in (("KB", 1e3), ("MB", 1e6)):
        if n_bytes < scale * 999.95:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes / 1e9:.1f} GB"
