"""Which image files a command-line INPUT stands for: a file, a folder (recursive) or a list file.

Nothing is decoded here; a path that does not exist or is named twice becomes an
:class:`ImageError` beside the good ones, as :func:`vitviz.io.images.load_images` does for bad images.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import FileContentError, ImageError
from ..settings import megabytes

# What the app's uploader accepts; other files in a folder (labels, READMEs) are not images to try.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")
LIST_SUFFIX = ".txt"
# A list file is read line by line and refused past either cap before it is read whole. Each entry held
# costs about 550 bytes of Python objects (its line, a Path, an ImageFile: measured with tracemalloc on
# 40-byte lines), so a million lines take about 0.6 GB; a longer image set goes in as a folder or
# several lists. 128 MiB allows 134 bytes a line on average.
MAX_LIST_LINES = 1_000_000
MAX_LIST_BYTES = 128 << 20


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
            return
        try:
            is_file = path.is_file()
        except OSError as exc:  # a name longer than the system allows (ENAMETOOLONG), say
            problems.append(ImageError(name, f"cannot be looked up ({exc.strerror})"))
            return
        if not is_file:
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
                lines = _read_list(path)
            except ImageError as exc:
                problems.append(ImageError(given, exc.reason))
                continue
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(ImageError(given, f"cannot be read as a list of paths ({exc})"))
                continue
            for line in (line.strip() for line in lines):
                if line and not line.startswith("#"):
                    add(path.parent / line, line)
        else:
            add(path, given)
    return files, problems


def _read_list(path: Path) -> list[str]:
    """The lines of a list file, refused past :data:`MAX_LIST_BYTES` (its size, before reading) or
    :data:`MAX_LIST_LINES` (counted while reading, so no more than the cap is ever held).

    Raises:
        ImageError: a sentence fragment naming the size and the cap (the caller names the file).
    """
    size = path.stat().st_size
    if size > MAX_LIST_BYTES:
        raise ImageError(str(path), f"is a list file of {megabytes(size)}, more than the {megabytes(MAX_LIST_BYTES)} "
                                    "a list of image paths may take; vitviz does not read it (give the folder, or "
                                    "split the list into several files).")
    lines = []
    with open(path) as f:
        for line in f:
            if len(lines) == MAX_LIST_LINES:
                raise ImageError(str(path), f"is a list file of more than {MAX_LIST_LINES:,} lines, the most a list "
                                            "of image paths may have; vitviz does not read the rest (give the folder, "
                                            "or split the list into several files).")
            lines.append(line)
    return lines


def _parquet_list(path: Path) -> list[str]:
    """The paths a Parquet list holds: its ``path`` column, else its ``image`` column (non-empty strings, in order).

    Raises:
        FileContentError: a sentence: not Parquet, neither column, or more than :data:`MAX_LIST_LINES` rows (read from
            the file's footer, before any row is read).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        if table.metadata.num_rows > MAX_LIST_LINES:
            raise FileContentError(f"is a Parquet list of {table.metadata.num_rows:,} rows, more than the "
                                   f"{MAX_LIST_LINES:,} a list of image paths may have; vitviz does not read it (split "
                                   "it into several files)")
        names = table.schema_arrow.names
        column = next((c for c in ("path", "image") if c in names), None)
        if column is None:
            raise FileContentError(f"has neither a 'path' nor an 'image' column to list images by (it has "
                                   f"{', '.join(names)})")
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise FileContentError(f"cannot be read as a Parquet list of paths ({str(exc).splitlines()[0]})") from exc
    return [str(v).strip() for v in values if v is not None and str(v).strip()]
