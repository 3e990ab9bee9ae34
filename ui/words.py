"""Counts in words: "1 image", "2 images" (:func:`vitviz.figures.core.counted`), and "1 of 3 images has"."""
from __future__ import annotations

from vitviz.figures.core import counted

__all__ = ["counted", "part_of"]


def part_of(k: int, n: int, noun: str, verbs: tuple[str, str] = ("has", "have")) -> str:
    """``k`` of ``n`` things and the verb that agrees with ``k``: ``part_of(1, 3, "image")`` -> "1 of 3 images has",
    ``part_of(2, 3, "image")`` -> "2 of 3 images have"."""
    return f"{k} of {counted(n, noun)} {verbs[0] if k == 1 else verbs[1]}"
