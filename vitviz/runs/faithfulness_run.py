"""``python -m vitviz faithfulness``: every method's perturbation curves over an image set, resumable.

Per batch of images: the maps (attention, rollout, attribution methods, seeded random maps), then every
image's curves under every protocol, the batch's perturbed inputs through the model together
(:func:`vitviz.perturbation.protocols.protocol_curves_batch`, ``PERTURBED_BATCH`` inputs per forward). A batch's
rows are written as two part files, renamed into place together (the AUC part last: it marks the batch
done); consolidation merges the parts into ``faithfulness.parquet`` and ``auc.parquet`` (sorted, so the
tables do not depend on batch order or engine), renames them into place and only then removes the
parts; rows are unique by key, so a consolidation cut short is never counted twice.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ..errors import VitvizError
from ..explainers import get_method, registered
from ..perturbation.curves import ORDERINGS, RANDOM_SEEDS, SEED_PREFIX, default_fractions, ordered, random_seed_maps
from ..perturbation.protocols import REPLACEMENTS, protocol_curves_batch
from ..io.inputs import ImageFile
from ..io.atomic import signals_held
from .engines import Engine, Parts, run_batches

CURVES_NAME, AUC_NAME, SETTINGS_NAME, SUMMARY_NAME = ("faithfulness.parquet", "auc.parquet", "settings.json",
                                                      "summary.json")
PARTS_DIR = ".vitviz-faithfulness-parts"
METHODS = tuple(registered())  # every map method of the registry (vitviz.explainers)
DEFAULT_METHODS = ("attnlrp", "rollout", "random")  # worth computing first: relevance, attention, chance
CURVE_SCHEMA = pa.schema([("image", pa.string()), ("method", pa.string()), ("protocol", pa.string()),
                          ("fraction", pa.float64()), ("score", pa.float64())])
PERTURBED_BATCH = 64  # perturbed inputs per forward: the memory bound of the curves (64 x 3 x 224 x 224 float32: 39 MB)
AUC_SCHEMA = pa.schema([("image", pa.string()), ("method", pa.string()), ("protocol", pa.string()),
                        ("auc", pa.float64())])


def parse_list(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    """``"a,b"`` -> ["a", "b"], each checked against ``allowed`` (a sentence naming the option otherwise)."""
    items = list(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    unknown = [m for m in items if m not in allowed]
    if unknown or not items:
        raise VitvizError(f"{option}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}.")
    return items


@dataclass(frozen=True)
class RunSettings:
    """What decides a run's numbers (a DIR holds one run: resuming with others is refused).

    Attributes:
        methods: among :data:`METHODS`; protocols: among PROTOCOLS and CHEFER; replacement: mean or blur;
        ordering: how signed maps order patches; steps: fractions 0..1 of MoRF/LeRF/insertion;
        random_seeds: seeds of the random floor, from first_seed; target_class: the class scored and explained
        (None: each image's top-1, or the projection/cosine of a headless model); model: the --model string.
    """

    model: str
    methods: tuple[str, ...]
    protocols: tuple[str, ...]
    replacement: str = "mean"
    ordering: str = "signed"
    steps: int = 11
    random_seeds: int = RANDOM_SEEDS
    first_seed: int = 0
    target_class: int | None = None
    checkpoint: str | None = None
    img_size: int | None = None
    head: str | None = None  # a probe file giving the model its classes (vitviz.probes)

    def check(self) -> None:
        if self.replacement not in REPLACEMENTS:
            raise VitvizError(f"--replacement must be one of {', '.join(REPLACEMENTS)}, not {self.replacement!r}.")
        if self.ordering not in ORDERINGS:
            raise VitvizError(f"--ordering must be one of {', '.join(ORDERINGS)}, not {self.ordering!r}.")
        if self.steps < 2:
            raise VitvizError(f"--steps must be 2 or more, not {self.steps}.")
        if "random" in self.methods and self.random_seeds < 2:
            raise VitvizError(f"--random-seeds must be 2 or more for a spread of chance, not {self.random_seeds}.")

    def record(self) -> dict:
        return asdict(self) | {"methods": list(self.methods), "protocols": list(self.protocols)}


def image_maps(loaded, x: torch.Tensor, settings: RunSettings) -> list[dict[str, np.ndarray]]:
    """Each image's maps, in the order of ``settings.methods`` (random: one map per seed): (B, 3, H, W) -> B dicts.

    Every method comes from the registry (:func:`vitviz.explain`); signed maps are ordered by ``settings.ordering``;
    the attention methods share one forward."""
    from ..explainers.targets import default_target
    from ..explainers import explain
    from ..lens import Lens

    lens = Lens(loaded)
    maps: list[dict[str, np.ndarray]] = [{} for _ in range(len(x))]
    chosen = {m: get_method(m) for m in settings.methods if m != "random"}
    trace = lens.trace(x, keep="attn") if any(m.kind == "attention" for m in chosen.values()) else None
    target = None
    for name in settings.methods:
        if name == "random":  # the floor: one map per seed
            layout = lens.layout_for(x)
            for i in range(len(x)):
                maps[i] |= random_seed_maps(layout.grid_size, settings.first_seed, settings.random_seeds)
            continue
        method = chosen[name]
        if method.kind in ("relevance", "perturbation") and target is None:
            target = default_target(loaded.model, settings.target_class)
        grids = explain(lens, x, name, target if method.kind != "attention" else None, trace=trace).patches
        for i in range(len(x)):
            maps[i][name] = ordered(grids[i], settings.ordering) if method.signed else grids[i]
    return maps


def image_tables(loaded, x: torch.Tensor, names: list[str], settings: RunSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Curves and AUC rows of a batch (B, 3, H, W): ``random`` is the mean over seeds (curves and AUCs), each seed
    kept as ``random_seed_<s>``; the LeRF - MoRF summary is an AUC row."""
    layout = loaded.adapter.layout(loaded.model, tuple(x.shape[-2:]))
    curves, aucs = [], []
    results = protocol_curves_batch(loaded.model, x, image_maps(loaded, x, settings), layout,
                                    protocols=settings.protocols, replacement=settings.replacement,
                                    fractions=default_fractions(settings.steps), target=settings.target_class,
                                    batch_size=PERTURBED_BATCH)
    for name, result in zip(names, results):
        seeds = [k for k, m in enumerate(result.methods) if m.startswith(SEED_PREFIX)]
        for p in result.protocols:
            values = result.curves[p]
            rows = list(zip(result.methods, values))
            if seeds:
                rows.append(("random", values[seeds].mean(axis=0)))
            for method, curve in rows:
                curves += [(name, method, p, float(f), float(s)) for f, s in zip(result.fractions[p], curve)]
        for p, values in result.aucs().items():
            rows = list(zip(result.methods, values)) + ([("random", float(values[seeds].mean()))] if seeds else [])
            aucs += [(name, method, p, float(v)) for method, v in rows]
    return (pd.DataFrame(curves, columns=CURVE_SCHEMA.names), pd.DataFrame(aucs, columns=AUC_SCHEMA.names))


@dataclass
class Batch:
    """One batch's rows and its files that could not be used."""

    files: int
    curves: pd.DataFrame | None
    aucs: pd.DataFrame | None
    bad: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class FaithfulnessWork:
    """The per-batch function of ``faithfulness`` (:mod:`vitviz.runs.engines`): a batch's curve and AUC rows."""

    settings: RunSettings

    def __call__(self, lens, batch) -> tuple[pd.DataFrame, pd.DataFrame]:
        return image_tables(lens.loaded, batch.x, batch.names, self.settings)


def _batches(batches) -> Iterator[Batch]:
    for b in batches:
        curves, aucs = b.value if b.value is not None else (None, None)
        yield Batch(b.files, curves, aucs, b.bad)


def run_local(loaded, files: list[ImageFile], settings: RunSettings, batch_size: int) -> Iterator[Batch]:
    """Batches of ``files`` in order, decoded and run in this process."""
    from ..lens import Lens

    return _batches(run_batches(FaithfulnessWork(settings), Lens(loaded), files, batch_size))


def run_ray(spec, files: list[ImageFile], settings: RunSettings, batch_size: int, workers: int,
            address: str | None) -> Iterator[Batch]:
    """The same batches run by ``workers`` Ray actors, each holding one model, streamed back in file order."""
    return _batches(run_batches(FaithfulnessWork(settings), spec, files, batch_size, Engine("ray", workers, address)))


# ---- the files ------------------------------------------------------------------------------------------------

class FaithfulnessStore:
    """``faithfulness.parquet`` and ``auc.parquet`` of one output folder and their part files."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.store = Parts(folder / PARTS_DIR)
        self.parts = self.store.folder

    def write_batch(self, curves: pd.DataFrame, aucs: pd.DataFrame) -> None:
        """Make one batch durable: both part files appear together or not at all (AUC last: it marks it done)."""
        self.store.write([("curves", curves, CURVE_SCHEMA), ("auc", aucs, AUC_SCHEMA)])

    def consolidate(self) -> pd.DataFrame:
        """Merge the finished parts into the tables; returns the AUC table."""
        done = [p.name.removeprefix("auc-") for p in self.store.done("auc")]
        tables = {}
        for kind, name, schema, key in (("curves", CURVES_NAME, CURVE_SCHEMA, ["image", "method", "protocol", "fraction"]),
                                        ("auc", AUC_NAME, AUC_SCHEMA, ["image", "method", "protocol"])):
            sources = [self.folder / name] if (self.folder / name).exists() else []
            sources += [self.parts / f"{kind}-{p}" for p in done]
            frames = [pq.read_table(s, schema=schema).to_pandas() for s in sources]
            frame = pd.concat(frames, ignore_index=True) if frames else schema.empty_table().to_pandas()
            frame = frame.drop_duplicates(key).sort_values(key, kind="stable").reset_index(drop=True)
            tables[name] = (frame, schema)
        if done or not all((self.folder / n).exists() for n in tables):
            for name, (frame, schema) in tables.items():
                pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False),
                               self.parts / f".{name}.tmp")
            with signals_held():
                for name in (CURVES_NAME, AUC_NAME):  # AUC last: its images count as done
                    os.replace(self.parts / f".{name}.tmp", self.folder / name)
        self.store.clear()
        return tables[AUC_NAME][0]

    def write_json(self, name: str, record: dict) -> None:
        tmp = self.parts / f".{name}.tmp"
        tmp.write_text(json.dumps(record, indent=2, default=str))
        os.replace(tmp, self.folder / name)

    def close(self) -> None:
        self.store.close()


def same_run(previous: dict, settings: RunSettings) -> str | None:
    """A sentence when ``previous`` (a settings.json) records a run with other settings, else None."""
    recorded = previous.get("run")
    if not recorded:
        return None
    now = settings.record()
    differing = [k for k in now if recorded.get(k) != now[k]]
    if differing:
        return (f"the folder holds a run with other settings ({', '.join(differing)}: "
                + "; ".join(f"{k} {recorded.get(k)!r} there, {now[k]!r} now" for k in differing)
                + "); give another --out, or the same settings to go on.")
    return None


@dataclass
class FaithfulnessTables:
    """The tables ``python -m vitviz faithfulness`` writes, for one batch.

    Attributes:
        curves: rows (image, method, protocol, fraction, score) — ``faithfulness.parquet``'s columns.
        aucs: rows (image, method, protocol, auc) — ``auc.parquet``'s columns.
        settings: the run's settings (``settings.json``'s ``run`` entry).
    """

    curves: pd.DataFrame
    aucs: pd.DataFrame
    settings: dict


def faithfulness(lens, x, methods: list[str] | tuple[str, ...] = ("attnlrp", "rollout", "random"),
                 protocols: tuple[str, ...] = ("morf", "lerf", "insertion"), names: list[str] | None = None,
                 **settings) -> FaithfulnessTables:
    """Perturbation curves and AUCs of ``methods`` on a batch, as ``python -m vitviz faithfulness`` computes them.

    Args:
        x: as :func:`explain` takes it.
        methods: registered names; ``"random"`` is the floor (mean of ``random_seeds`` seeded maps).
        protocols: among ``morf``, ``lerf``, ``insertion`` and Chefer's ``positive`` / ``negative`` (classifiers).
        names: one name per image for the tables (default ``image0``, ``image1``, ...).
        settings: the CLI's options by their :class:`vitviz.runs.faithfulness_run.RunSettings` names (``replacement``,
            ``ordering``, ``steps``, ``random_seeds``, ``first_seed``, ``target_class``).
    """
    from ..explainers import as_tensor

    tensor = as_tensor(lens, x)
    run = RunSettings(model=lens.spec.name, methods=tuple(parse_list(",".join(methods), METHODS,
                                                                     "methods")),
                      protocols=tuple(protocols), checkpoint=lens.spec.checkpoint, img_size=lens.spec.img_size,
                      head=lens.spec.head, **settings)
    run.check()
    names = names or [f"image{i}" for i in range(len(tensor))]
    curves, aucs = image_tables(lens.loaded, tensor, names, run)
    return FaithfulnessTables(curves, aucs, run.record())
