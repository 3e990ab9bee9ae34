"""Which image files a command-line INPUT stands for: a file, a folder (recursive) or a list file.

Nothing is decoded here; a path that does not exist or is named twice becomes an
:class:`ImageError` beside the good ones, as :func:`vitviz.images.load_images` does for bad images.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ImageError

# What the app's uploader accepts; other files in a folder (labels, READMEs) are not images to try.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")
LIST_SUFFIX = ".txt"


@dataclass(frozen=True)
class ImageFile:
    """One file to analyse.

    Attributes:
        path: where to read it.
        name: how tables and messages name it: the path as given, relative to its folder for a
            folder INPUT, or the line as written for a list file.
    """

    path: Path
    name: str


def expand_inputs(inputs: list[str | Path]) -> tuple[list[ImageFile], list[ImageError]]:
    """Image files of INPUTs in order, each name once.

    An INPUT is an image file; a folder, searched recursively for files with
    :data:`IMAGE_SUFFIXES` (sorted, so ImageNet-style class folders come in class order); or a
    ``.txt`` file listing one path per line (blank lines and lines starting with ``#`` ignored;
    relative paths are relative to the list file's folder), or a ``.parquet`` table whose ``path`` (else ``image``)
    column lists them the same way.

    Returns:
        (the files, one :class:`ImageError` per INPUT or list entry that does not exist or repeats a name).
    """
    files, problems, seen = [], [], set()

    def add(path: Path, name: str) -> None:
        if name in seen:
            problems.append(ImageError(name, "is named twice; the first one is used"))
        elif not path.is_file():
            problems.append(ImageError(name, "does not exist" if not path.exists() else "is not a file"))
        else:
            seen.add(name)
            files.append(ImageFile(path, name))

    for given in map(str, inputs):
        path = Path(given)
        if path.is_dir():
            for found in sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
                add(found, found.relative_to(path).as_posix())
        elif path.suffix.lower() == ".parquet" and path.is_file():
            try:
                lines = _parquet_list(path)
            except ValueError as exc:
                problems.append(ImageError(given, str(exc)))
                continue
            for line in lines:
                add(path.parent / line, line)
        elif path.suffix.lower() == LIST_SUFFIX and path.is_file():
            try:
                lines = path.read_text().splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(ImageError(given, f"cannot be read as a list of paths ({exc})"))
                continue
            for line in (line.strip() for line in lines):
                if line and not line.startswith("#"):
                    add(path.parent / line, line)
        else:
            add(path, given)
    return files, problems


def _parquet_list(path: Path) -> list[str]:
    """The paths a Parquet list holds: its ``path`` column, else its ``image`` column (non-empty strings, in order).

    Raises:
        ValueError: a sentence: not Parquet, or neither column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.ParquetFile(path).schema_arrow.names
        column = next((c for c in ("path", "image") if c in names), None)
        if column is None:
            raise ValueError(f"has neither a 'path' nor an 'image' column to list images by (it has {', '.join(names)})")
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"cannot be read as a Parquet list of paths ({str(exc).splitlines()[0]})") from exc
    return [str(v).strip() for v in values if v is not None and str(v).strip()]
