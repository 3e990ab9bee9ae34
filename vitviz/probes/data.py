"""Labelled images for a probe: class folders (``root/<class>/*.jpg``, torchvision's ImageFolder convention) or a
label file (CSV or Parquet with the columns ``path`` and ``label``).

Everything is checked here, once, before any model runs: a path that does not exist, a file listed twice, a
row without a label, a set with one class only, and a class with one image (cross-validation holds images out,
so every class needs two) each get a sentence naming the file and the line (CSV lines count from 1 with the
header as line 1; Parquet rows count from 1).
"""
from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import VitvizError
from ..io.inputs import IMAGE_SUFFIXES

LABEL_COLUMNS = ("path", "label")


class LabelError(VitvizError):
    """A label file or class folder that cannot train a probe (the sentence names the file and line)."""


@dataclass(frozen=True)
class LabelledImages:
    """Images with one class each, in a fixed order.

    Attributes:
        paths: where each image is read from (or the decoded image itself, :class:`vitviz.io.images.LoadedImage`: the
            app's uploads).
        names: how messages and probe.json name each image (the path as written in the label file, or relative
            to the class folders' root).
        labels: the class of each image, as written.
        where: for each image, where its label comes from ("labels.csv line 4", "root/dog/"), for messages.
    """

    paths: tuple  # Path | LoadedImage
    names: tuple[str, ...]
    labels: tuple[str, ...]
    where: tuple[str, ...]

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes, sorted (the head's order: row k of the weight is ``classes[k]``)."""
        return tuple(sorted(set(self.labels)))

    def targets(self) -> list[int]:
        """Each image's class index into :attr:`classes` (0-based)."""
        index = {c: i for i, c in enumerate(self.classes)}
        return [index[c] for c in self.labels]

    def check(self, source: str) -> "LabelledImages":
        """Refuse a set with fewer than two classes or a class with one image (``source`` names the file)."""
        counts = Counter(self.labels)
        if not counts:
            raise LabelError(f"{source} lists no images.")
        if len(counts) == 1:
            (only,) = counts
            raise LabelError(f"{source}: every image has the class {only!r}; a probe needs at least two classes.")
        for cls, n in counts.items():
            if n == 1:
                where = self.where[self.labels.index(cls)]
                raise LabelError(f"{where}: class {cls!r} has this one image only; cross-validation holds images "
                                 "out, so every class needs at least two (add images or leave the class out).")
        return self


def from_folders(roots: list[str | Path]) -> LabelledImages:
    """Images in class folders: each ``root/<class>/`` holds that class's images (searched recursively, sorted).

    Raises:
        LabelError: a root that is not a folder, a root without class folders, or a bad set (:meth:`LabelledImages.check`).
    """
    paths, names, labels, where = [], [], [], []
    for root in map(Path, roots):
        if not root.is_dir():
            raise LabelError(f"{root} is not a folder: with --folders each INPUT is a folder of class folders "
                             "(root/<class>/*.jpg).")
        classes = sorted(p for p in root.iterdir() if p.is_dir())
        if not classes:
            raise LabelError(f"{root} has no class folders: with --folders each INPUT holds one folder per class "
                             "(root/<class>/*.jpg).")
        for folder in classes:
            for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
                paths.append(path)
                names.append(path.relative_to(root).as_posix())
                labels.append(folder.name)
                where.append(f"{folder}/")
    source = " and ".join(str(r) for r in roots)
    return LabelledImages(tuple(paths), tuple(names), tuple(labels), tuple(where)).check(source)


def from_label_file(path: str | Path, root: str | Path | None = None) -> LabelledImages:
    """Images listed in a CSV (header ``path,label``) or Parquet file (columns ``path`` and ``label``).

    Args:
        path: the label file.
        root: the folder relative paths are read from; default the label file's folder.

    Raises:
        LabelError: the file cannot be read, lacks a column, or a row names a missing file, repeats a file or has no
            label (the sentence names the file and the line), or the set is bad (:meth:`LabelledImages.check`).
    """
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    if not path.is_file():
        raise LabelError(f"{path} does not exist: --labels names a CSV or Parquet file with the columns path,label.")
    rows, unit, first = (_parquet_rows(path), "row", 1) if path.suffix.lower() == ".parquet" else (_csv_rows(path), "line", 2)
    paths, names, labels, where, seen = [], [], [], [], {}
    for number, (name, label) in enumerate(rows, start=first):
        at = f"{path.name} {unit} {number}"
        name, label = (name or "").strip(), (label or "").strip()
        if not name:
            raise LabelError(f"{at} has no path.")
        if not label:
            raise LabelError(f"{at}: {name} has no label.")
        image = Path(name) if Path(name).is_absolute() else root / name
        if not image.is_file():
            raise LabelError(f"{at}: {image} does not exist" + (" (it is a folder)." if image.is_dir() else "."))
        key = image.resolve()
        if key in seen:
            raise LabelError(f"{at}: {name} is listed twice (first on {unit} {seen[key]}).")
        seen[key] = number
        paths.append(image)
        names.append(name)
        labels.append(label)
        where.append(at)
    return LabelledImages(tuple(paths), tuple(names), tuple(labels), tuple(where)).check(str(path))


def _csv_rows(path: Path) -> list[tuple[str, str]]:
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in LABEL_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise LabelError(f"{path.name} line 1: the header has no {' or '.join(repr(c) for c in missing)} "
                                 f"column (it has {', '.join(reader.fieldnames or []) or 'nothing'}); a label file's "
                                 "header is path,label.")
            return [(row["path"], row["label"]) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LabelError(f"{path} cannot be read as a CSV label file ({exc}).") from None


def _parquet_rows(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means "not a Parquet table"
        raise LabelError(f"{path} cannot be read as a Parquet label file ({exc}).") from None
    missing = [c for c in LABEL_COLUMNS if c not in table.column_names]
    if missing:
        raise LabelError(f"{path.name} has no {' or '.join(repr(c) for c in missing)} column (it has "
                         f"{', '.join(table.column_names)}); a label file has the columns path,label.")
    values = [table.column(c).to_pylist() for c in LABEL_COLUMNS]
    return [(None if p is None else str(p), None if lab is None else str(lab)) for p, lab in zip(*values)]
