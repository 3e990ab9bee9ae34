"""Counts in words: "1 image", "2 images" (:func:`vitviz.words.counted`), "1 image gives", "2 images give"
(:func:`subject`) and "1 of 3 images has" (:func:`part_of`)."""
from __future__ import annotations

from vitviz.words import counted

__all__ = ["counted", "part_of", "subject"]


def _verb(n: int, verbs: tuple[str, str]) -> str:
    return verbs[0] if n == 1 else verbs[1]


def subject(n: int, noun: str, verbs: tuple[str, str] = ("has", "have")) -> str:
    """``n`` things and the verb that agrees with them: ``subject(1, "image", ("gives", "give"))`` -> "1 image
    gives", ``subject(2, "image", ("gives", "give"))`` -> "2 images give"."""
    return f"{counted(n, noun)} {_verb(n, verbs)}"


def part_of(k: int, n: int, noun: str, verbs: tuple[str, str] = ("has", "have")) -> str:
    """``k`` of ``n`` things and the verb that agrees with ``k``: ``part_of(1, 3, "image")`` -> "1 of 3 images has",
    ``part_of(2, 3, "image")`` -> "2 of 3 images have"."""
    return f"{k} of {counted(n, noun)} {_verb(k, verbs)}"
