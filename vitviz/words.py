"""Counts in words, for every sentence vitviz writes (figures, CLI lines, errors): "1 image", "3 patches"."""
from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, singular for exactly one: ``counted(1, "image")`` -> "1 image", ``counted(3, "patch")`` ->
    "3 patches"; ``plural`` where adding "s" or "es" is wrong."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {plural or noun + ('es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's')}"
