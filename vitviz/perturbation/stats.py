"""What a set of images can say about faithfulness: bootstrap intervals over images, paired by image.

Every AUC of a run has one value per (image, method, protocol). Over the images:

- a method's mean AUC gets a percentile bootstrap 95 % interval: :data:`RESAMPLES` resamples of the
  images with replacement, seed :data:`SEED` (numpy ``default_rng``), the 2.5th and 97.5th percentiles of
  the resampled means;
- two methods are compared *paired*: the per-image difference a - b, bootstrapped the same way (the same
  images are drawn for both). A difference is significant when its interval excludes 0.

The random floor is the row ``random`` (the mean over seeds, per image); its per-seed rows
(``random_seed_<s>``) give the spread of chance.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .curves import SEED_PREFIX
from .protocols import BETTER, LABELS

RESAMPLES, SEED, LEVEL = 10_000, 0, 0.95
RANDOM = "random"
ORDER = ("morf", "lerf", "lerf_minus_morf", "insertion", "positive", "negative")


@dataclass(frozen=True)
class Interval:
    """A mean over images and its bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap_mean(values: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> Interval:
    """The mean of ``values`` (n,) and the percentile bootstrap interval of the mean (resampling the n values)."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0:
        raise ValueError("a bootstrap interval needs at least one value")
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = values[draws].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(values.mean()), float(low), float(high), n)


def paired_difference(a: pd.Series, b: pd.Series, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """Mean over images of a - b and its bootstrap interval, the same images drawn for both: a, b indexed by image
    (only images in both count)."""
    both = a.index.intersection(b.index)
    return bootstrap_mean((a.loc[both] - b.loc[both]).to_numpy(), resamples, seed)


def _wide(auc: pd.DataFrame, protocol: str) -> pd.DataFrame:
    rows = auc[auc["protocol"] == protocol]
    return rows.pivot_table(index="image", columns="method", values="auc", aggfunc="first")


def verdict(difference: Interval, protocol: str) -> str:
    """``"better"``, ``"worse"`` or ``"chance"`` for a method minus the random floor under ``protocol``."""
    if not difference.excludes_zero:
        return "chance"
    lower_better = BETTER[protocol] == "lower"
    return "better" if (difference.mean < 0) == lower_better else "worse"


def sentence(method: str, difference: Interval, protocol: str) -> str:
    """One plain sentence about a method against the random floor over the set."""
    label = LABELS[protocol]
    spread = f"{difference.mean:+.3f}, 95 % interval {difference.low:+.3f} to {difference.high:+.3f}, {difference.n} images"
    v = verdict(difference, protocol)
    if v == "chance":
        return f"{method} cannot be told from chance on {label} (difference from random {spread})."
    return f"{method} is {'better' if v == 'better' else 'worse'} than random on {label} (difference {spread})."


def summarise(auc: pd.DataFrame, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Per protocol: each method's mean AUC with its interval, the random seeds' spread, and the paired differences.

    Args:
        auc: columns image, method, protocol, auc (``auc.parquet``).

    Returns:
        {"resamples", "seed", "level", "protocols": {protocol: {"better": "lower"|"higher", "methods": [...],
        "random_seeds": {...} or None, "differences": [...]}}}; every difference is a - b paired by image.
    """
    out = {"resamples": resamples, "seed": seed, "level": LEVEL, "protocols": {}}
    present = set(auc["protocol"])
    for protocol in [p for p in ORDER if p in present] + sorted(present - set(ORDER)):
        wide = _wide(auc, protocol)
        seeds = [c for c in wide.columns if str(c).startswith(SEED_PREFIX)]
        methods = [c for c in dict.fromkeys(auc.loc[auc["protocol"] == protocol, "method"]) if c not in seeds]
        methods = [m for m in methods if m != RANDOM] + [m for m in methods if m == RANDOM]  # the floor last
        rows = []
        for m in methods:
            i = bootstrap_mean(wide[m].dropna().to_numpy(), resamples, seed)
            row = {"method": m, "mean": i.mean, "low": i.low, "high": i.high, "images": i.n}
            if RANDOM in wide.columns and m != RANDOM:
                d = paired_difference(wide[m].dropna(), wide[RANDOM].dropna(), resamples, seed)
                row |= {"vs_random": verdict(d, protocol), "sentence": sentence(m, d, protocol),
                        "minus_random": {"mean": d.mean, "low": d.low, "high": d.high, "n": d.n}}
            rows.append(row)
        spread = None
        if seeds:
            per_seed = wide[seeds].mean(axis=0)  # each seed's mean AUC over the images
            spread = {"seeds": len(seeds), "mean": float(per_seed.mean()),
                      "sd_over_seeds": float(per_seed.std(ddof=1)) if len(seeds) > 1 else 0.0,
                      "per_seed_mean": {str(k): float(v) for k, v in per_seed.items()}}
        differences = []
        for k, a in enumerate(methods):
            for b in methods[k + 1:]:
                d = paired_difference(wide[a].dropna(), wide[b].dropna(), resamples, seed)
                a_better = (d.mean < 0) == (BETTER.get(protocol, "higher") == "lower")
                differences.append({"a": a, "b": b, "mean": d.mean, "low": d.low, "high": d.high, "images": d.n,
                                    "significant": d.excludes_zero,
                                    "more_faithful": (a if a_better else b) if d.excludes_zero else None})
        out["protocols"][protocol] = {"better": BETTER.get(protocol, "higher"), "methods": rows,
                                      "random_seeds": spread, "differences": differences}
    return out


def summary_lines(summary: dict) -> list[str]:
    """The summary as lines for a terminal: one block per protocol."""
    lines = [f"bootstrap 95 % intervals over images ({summary['resamples']} resamples, seed {summary['seed']})"]
    for protocol, block in summary["protocols"].items():
        lines.append(f"{LABELS.get(protocol, protocol)} ({block['better']} is more faithful):")
        for row in block["methods"]:
            lines.append(f"  {row['method']:<20} {row['mean']:8.3f}  [{row['low']:.3f}, {row['high']:.3f}]"
                         + (f"  {row['vs_random']}" if "vs_random" in row else ""))
        if block["random_seeds"]:
            s = block["random_seeds"]
            lines.append(f"  random over {s['seeds']} seeds: {s['mean']:.3f} ± {s['sd_over_seeds']:.3f} (s.d. of the "
                         "seeds' means)")
    return lines


AUC_COLUMNS = ("image", "method", "protocol", "auc")


def auc_path(source) -> Path:
    """The ``auc.parquet`` a typed path names: the file itself, or the one in a ``--out`` folder."""
    path = Path(source).expanduser()
    return path / "auc.parquet" if path.is_dir() else path


def read_auc_table(source, name: str | None = None, limit_bytes: int | None = None) -> pd.DataFrame:
    """A finished run's ``auc.parquet``: Parquet bytes (an upload) or a path to the file or its ``--out`` folder.

    Raises:
        VitvizError: one sentence naming the file: absent, not Parquet, over the memory budget, a column missing,
            or one (image, method, protocol) given twice.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..errors import VitvizError
    from ..sources.declared import open_user_table

    opened, metadata, name = open_user_table(source, "auc.parquet", "faithfulness", name, limit_bytes)
    try:
        handle = pq.ParquetFile(opened, metadata=metadata)
        missing = [c for c in AUC_COLUMNS if c not in handle.schema_arrow.names]
        if missing:
            raise VitvizError(f"{name}: not a vitviz faithfulness table: it lacks {', '.join(missing)} (expected the "
                              "auc.parquet that `python -m vitviz faithfulness --out DIR` writes).")
        table = handle.read(columns=list(AUC_COLUMNS)).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise VitvizError(f"{name}: not a Parquet file ({str(exc).splitlines()[0]}); expected the auc.parquet that "
                          "`python -m vitviz faithfulness --out DIR` writes.") from exc
    if not pd.api.types.is_numeric_dtype(table["auc"]):
        raise VitvizError(f"{name}: column auc holds {table['auc'].dtype}, not numbers.")
    repeated = int(table.duplicated(["image", "method", "protocol"]).sum())
    if repeated:
        raise VitvizError(f"{name}: {repeated} rows repeat an (image, method, protocol) given before.")
    return table.astype({"image": str, "method": str, "protocol": str, "auc": "float64"})
