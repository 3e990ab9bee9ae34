"""Class names for a model's classifier outputs: a file of one name per line, or a JSON list.

A model fine-tuned on a lab's own classes says "class 3" until it is told their names; ImageNet
heads (1000, 21843, ... outputs) are named without a file (:func:`vitviz.analyses.tokens.top_classes`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError

MAX_LABELS_BYTES = 4 << 20  # ImageNet-21k's 21843 names take 0.6 MB as text


@dataclass(frozen=True)
class ClassNames:
    """Names of a classifier's outputs in index order, and where they came from (for the sentences).

    Args:
        names: one per class, in the order of the head's outputs.
        source: the file or box they were read from, e.g. ``"classes.txt"``.
    """

    names: tuple[str, ...]
    source: str

    def check(self, num_classes: int, model: str) -> None:
        """Raise ModelError unless there is one name per class; ``model`` names the model in the sentence."""
        if num_classes == 0:
            raise ModelError(f"Class names ({self.source}): {model} has no classifier head, so there are no "
                             "classes to name.")
        if len(self.names) != num_classes:
            raise ModelError(f"Class names ({self.source}): {len(self.names)} names, but {model} has {num_classes} "
                             "classes; give exactly one name per class, in the order of the head's outputs.")


def parse_labels(text: str, source: str) -> ClassNames:
    """Class names from text: a JSON list of strings, or one name per line (blank lines at the end ignored).

    Raises:
        ModelError: a sentence naming ``source`` and the problem.
    """
    if text.lstrip().startswith("["):
        try:
            names = json.loads(text)
        except ValueError as exc:
            raise ModelError(f"Class names ({source}): it starts like a JSON list but is not one ({exc}).") from exc
        if not all(isinstance(n, str) for n in names):
            raise ModelError(f"Class names ({source}): the JSON list must hold strings, one name per class.")
        names = [n.strip() for n in names]
        empty = next((i for i, n in enumerate(names) if not n), None)
        if empty is not None:
            raise ModelError(f"Class names ({source}): entry {empty + 1} of the JSON list is empty.")
    else:
        names = [line.strip() for line in text.strip("\r\n").splitlines()]
        empty = next((i for i, n in enumerate(names) if not n), None)
        if empty is not None:
            raise ModelError(f"Class names ({source}): line {empty + 1} is empty; give one name per line, "
                             "in class-index order.")
    if not names:
        raise ModelError(f"Class names ({source}): no names in it.")
    return ClassNames(tuple(names), source)


def read_labels(path: Path) -> ClassNames:
    """Class names from a file (``--labels FILE``): UTF-8 text, one per line, or a JSON list.

    Raises:
        ModelError: the file is missing, unreadable, not text, larger than :data:`MAX_LABELS_BYTES`, or empty.
    """
    from ..settings import megabytes

    path = Path(path).expanduser()
    try:
        size = path.stat().st_size
        if size > MAX_LABELS_BYTES:
            raise ModelError(f"Class names ({path.name}): the file takes {megabytes(size)}, more than a list of "
                             f"class names needs (at most {megabytes(MAX_LABELS_BYTES)}).")
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise ModelError(f"Class names ({path}): no such file.") from exc
    except UnicodeDecodeError as exc:
        raise ModelError(f"Class names ({path.name}): it is not UTF-8 text (one name per line, or a JSON list).") \
            from exc
    except OSError as exc:
        raise ModelError(f"Class names ({path}): it could not be read ({exc.strerror or exc}).") from exc
    return parse_labels(text, path.name)
