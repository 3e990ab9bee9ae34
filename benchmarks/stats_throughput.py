"""`python -m vitviz stats`: throughput against the plain forward, Ray's overhead, peak memory.

Prints
  1. throughput of the stats loop (DataLoader decoding in 1 worker, capture, per-batch reduction,
     part files written) / throughput of the plain batched fused forward of the same model on the
     same images already decoded (same run, CPU, interleaved repeats, medians), with the steps
     between: capture alone and capture + reduction on the decoded tensors; the bundled model
     (ViT-S/14, real weights) on 32 images and ViT-B/16 (random weights) on 16, batches of 8;
  2. the whole command on 256 images with --engine local vs --engine ray (a local Ray with 2
     CPUs, 2 actors), wall time including start-up (deit-tiny, random weights, 224 px);
  3. peak RSS (VmHWM of the command's process) for 64 and 1024 images (deit-tiny, 224 px).

Images: generated 320x240 JPEGs (noise on a gradient), decoded and resized by the model's own
preprocessing. Usage: .venv/bin/python benchmarks/stats_throughput.py [throughput] [ray] [memory]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _memory import cli_in_fresh_process  # noqa: E402
from vitviz.trace import trace_for_analysis as capture  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.io.inputs import expand_inputs  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.analyses.stats import batch_tables  # noqa: E402
from vitviz.runs.stats_run import run_local  # noqa: E402
from vitviz.runs.stats_store import StatsStore  # noqa: E402


def make_images(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 200, 320)[None, :, None]
    for i in range(n):
        pixels = np.clip(ramp + rng.normal(0, 40, (240, 320, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:04d}.jpg", quality=90)
    return folder


def random_checkpoint(name: str, folder: Path) -> Path:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model(name, pretrained=False).state_dict().items()}, str(path))
    return path


def plain_rate(loaded, tensors: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for x in tensors:
            loaded.model(x)
    return sum(len(x) for x in tensors) / (time.perf_counter() - start)


def capture_rate(loaded, tensors: list[torch.Tensor], reduce: bool) -> float:
    """Capture alone, or capture + the per-batch reduction, on decoded tensors (no DataLoader, no writes)."""
    start = time.perf_counter()
    for x in tensors:
        if reduce:
            batch_tables(loaded, x, [str(i) for i in range(len(x))], "m")
        else:
            capture(loaded.model, x)
    return sum(len(x) for x in tensors) / (time.perf_counter() - start)


def stats_rate(loaded, folder: Path, batch_size: int, workers: int) -> float:
    files, _ = expand_inputs([folder])
    with tempfile.TemporaryDirectory() as out:
        store = StatsStore(Path(out))
        start = time.perf_counter()
        for batch in run_local(loaded, files, "m", batch_size, workers):
            store.write_batch(batch.tables)
        return len(files) / (time.perf_counter() - start)


def throughput(label: str, spec: ModelSpec, folder: Path, batch_size: int = 8, repeats: int = 3) -> None:
    loaded = load_model(spec)
    images = [load_image(p).image for p in sorted(folder.iterdir())]
    tensors = [preprocess(images[i:i + batch_size], loaded.data_config).tensor for i in range(0, len(images), batch_size)]
    rates = {"plain": [], "capture": [], "capture+reduce": [], "stats": []}
    for _ in range(repeats):  # interleaved: the machine's load moves them alike
        rates["plain"].append(plain_rate(loaded, tensors))
        rates["capture"].append(capture_rate(loaded, tensors, reduce=False))
        rates["capture+reduce"].append(capture_rate(loaded, tensors, reduce=True))
        rates["stats"].append(stats_rate(loaded, folder, batch_size, workers=1))
    m = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{label}: {len(images)} images, batch {batch_size}, medians of {repeats}: "
          + ", ".join(f"{k} {v:.2f} img/s ({1000 / v:.0f} ms/img, {v / m['plain']:.2f}x plain)" for k, v in m.items())
          + f"; every run: { {k: [round(r, 2) for r in v] for k, v in rates.items()} }", flush=True)



def main(parts: list[str]) -> None:
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "throughput" in parts:
            throughput("bundled ViT-S/14 @224", ModelSpec(), make_images(tmp / "img32", 32))
            base = random_checkpoint("vit_base_patch16_224", tmp)
            throughput("ViT-B/16 @224 (random)", ModelSpec(name="vit_base_patch16_224", checkpoint=str(base)),
                       make_images(tmp / "img16", 16))
        if "ray" in parts or "memory" in parts:
            whole_commands(tmp, parts)
    print(f"load average at end: {os.getloadavg()}", flush=True)


def whole_commands(tmp: Path, parts: list[str]) -> None:
    tiny = random_checkpoint("deit_tiny_patch16_224", tmp)
    model = ["--model", "deit_tiny_patch16_224", "--checkpoint", str(tiny), "--batch-size", "8"]
    if "ray" in parts:
        folder = make_images(tmp / "img256", 256)
        walls = {}
        for engine, workers in (("local", "1"), ("ray", "2")):
            walls[engine], _, _ = cli_in_fresh_process(["stats", str(folder), "--out", str(tmp / engine), *model,
                                               "--engine", engine, "--workers", workers])
        print(f"256 images, deit-tiny @224, whole command: local {walls['local']:.1f} s, ray (local, 2 CPUs, "
              f"2 actors) {walls['ray']:.1f} s, ray / local = {walls['ray'] / walls['local']:.2f}", flush=True)
    if "memory" in parts:
        for n in (64, 1024):
            wall, hwm, _ = cli_in_fresh_process(["stats", str(make_images(tmp / f"mem{n}", n)), "--out", str(tmp / f"m{n}"),
                                        *model, "--workers", "1"])
            print(f"peak RSS, {n} images, deit-tiny @224, batch 8: {hwm / 1024:.0f} MiB ({wall:.1f} s, "
                  f"{n / wall:.1f} img/s whole command)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["throughput", "ray", "memory"])
