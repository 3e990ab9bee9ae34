"""`vitviz.similarity`: the cost of a 12 x 12 CKA map over N images against the N forwards, and its memory against N.

Prints
  1. for N images (default 32, 64, 128; batches of 32): the wall time of ``vitviz.similarity(lens, lens, paths)``
     (decoding, preprocessing, the forwards through ``lens.trace`` and the CKA sums, with the bootstrap's 200
     replicates, and with none) over the time of the same images' forwards alone (decoding, preprocessing and
     ``lens.trace(x, keep="resid_post")`` per batch: what similarity cannot avoid), and over timm's own fused
     ``forward_features``; the bundled model (DINOv2 ViT-S/14, 12 blocks, real weights), 224 px, pooling tokens;
  2. the same for the bundled model against a ResNet-50 (random weights, its 5 stages), pooling mean, N = 64:
     the ratio is against both models' forwards;
  3. the peak resident memory added by one ``similarity`` call (VmHWM; a fresh process per N, after a warm-up call)
     at each N: flat in N when the images stream from disk.

  0. (``--parts``) one minibatch of 32 taken apart, interleaved over ``--repeats`` runs (medians): the forward that
     reads the 12 blocks (``lens.trace``), the 12 Gram matrices (pooling tokens: 256 patches x 384 dims per image),
     and the CKA sums with and without the bootstrap's 200 replicates; the load of a shared machine moves each part
     alike, so their ratios hold better than those of whole runs;
  5. (``--cli``) the command (``python -m vitviz similarity``, in this process: the engine, each minibatch written as a
     part, the two files at the end) against ``vitviz.similarity`` and the forwards, N = 64 (``--images``' largest);
  4. (``--calibration``, no model) the interval's calibration on simulated features: for unrelated and for related
     features (48 dims, 60 fresh samples each), the spread (standard deviation) of the estimate over samples against
     the bootstrap's mean 95 % width / 3.92, and how often the interval holds the true value (0, or the mean
     estimate), for 48 images in minibatches of 8, 64 in 16 and 256 in 32.

Images: generated 320x240 JPEGs (noise on a gradient) on disk. Medians of ``--repeats`` interleaved runs.
Usage: .venv/bin/python benchmarks/similarity.py [--images 32 64 128] [--repeats 2] [--calibration] [--parts] [--cli]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import peak_extra_mib  # noqa: E402
from stats_throughput import make_images  # noqa: E402
import vitviz  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402

BATCH = 32


def forwards(sides, paths: list[Path], fused: bool = False) -> None:
    """Each model's forward over the images, a batch at a time, as similarity runs them (decode, preprocess, read)."""
    for start in range(0, len(paths), BATCH):
        pictures = [load_image(p).image for p in paths[start:start + BATCH]]
        for side in sides:
            if isinstance(side, vitviz.CNNFeatures):
                side.features(side.preprocess(pictures), "mean")
            elif fused:
                with torch.inference_mode():
                    side.model.forward_features(side.preprocess(pictures).tensor)
            else:
                side.trace(side.preprocess(pictures), keep="resid_post")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--calibration", action="store_true", help="only the interval's calibration (no model)")
    parser.add_argument("--parts", action="store_true", help="only one minibatch's parts")
    parser.add_argument("--cli", action="store_true", help="only the command against the library call")
    parser.add_argument("--memory-of", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        return memory_of(args.memory_of, args.folder)
    if args.calibration:
        return calibration()
    if args.parts:
        return parts(args.repeats)
    if args.cli:
        return command(max(args.images), args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, timm {timm.__version__}")
    lens = vitviz.open("bundled", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_images(Path(tmp) / "images", max(args.images))
        every = sorted(folder.iterdir())
        vitviz.similarity(lens, lens, every[:8], batch_size=BATCH)  # warm-up
        print("\n1. bundled model against itself, 12 x 12, pooling tokens, batches of 32")
        print("| N | forwards (trace) s | timm fused s | similarity s | ratio to trace | ratio to fused "
              "| without bootstrap s | ratio to trace |")
        print("|---|---|---|---|---|---|---|---|")
        for n in args.images:
            paths = every[:n]
            runs = {"trace": [], "fused": [], "cka": [], "cka0": []}
            for _ in range(args.repeats):
                runs["trace"].append(timed(lambda: forwards([lens], paths)))
                runs["fused"].append(timed(lambda: forwards([lens], paths, fused=True)))
                runs["cka"].append(timed(lambda: vitviz.similarity(lens, lens, paths, batch_size=BATCH)))
                runs["cka0"].append(timed(lambda: vitviz.similarity(lens, lens, paths, batch_size=BATCH,
                                                                    bootstrap=0)))
            m = {k: statistics.median(v) for k, v in runs.items()}
            print(f"| {n} | {m['trace']:.2f} | {m['fused']:.2f} | {m['cka']:.2f} | {m['cka'] / m['trace']:.2f} "
                  f"| {m['cka'] / m['fused']:.2f} | {m['cka0']:.2f} | {m['cka0'] / m['trace']:.2f} |", flush=True)

        print("\n2. bundled model against a ResNet-50 (random weights), 12 x 5, pooling mean, N = 64")
        cnn = vitviz.CNNFeatures(timm.create_model("resnet50", pretrained=False))
        paths = every[:64]
        both, cka = [], []
        for _ in range(args.repeats):
            both.append(timed(lambda: forwards([lens, cnn], paths)))
            cka.append(timed(lambda: vitviz.similarity(lens, cnn, paths, pooling="mean", batch_size=BATCH)))
        print(f"both forwards {statistics.median(both):.2f} s, similarity {statistics.median(cka):.2f} s, "
              f"ratio {statistics.median(cka) / statistics.median(both):.2f}", flush=True)

        print("\n3. peak RSS added by one similarity call (a fresh process each, after a warm-up call on 8 images), "
              "pooling tokens, batches of 32")
        for n in args.images:
            out = subprocess.run([sys.executable, __file__, "--memory-of", str(n), "--folder", str(folder)],
                                 capture_output=True, text=True, check=True).stdout
            print(f"N = {n}: +{float(out.split()[-1]):.0f} MiB", flush=True)


def command(n: int, repeats: int) -> None:
    from vitviz.cli import main as cli

    lens = vitviz.open("bundled", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_images(Path(tmp) / "images", n)
        paths = sorted(folder.iterdir())
        vitviz.similarity(lens, lens, paths[:8], batch_size=BATCH)  # warm-up
        runs = {"forwards": [], "library": [], "command": []}
        for r in range(repeats):
            runs["forwards"].append(timed(lambda: forwards([lens], paths)))
            runs["library"].append(timed(lambda: vitviz.similarity(lens, lens, paths, batch_size=BATCH)))
            out = Path(tmp) / f"out{r}"
            runs["command"].append(timed(lambda: cli(["similarity", str(folder), "--out", str(out), "--workers", "0",
                                                      "--batch-size", str(BATCH), "--device", "cpu"])))
    m = {k: statistics.median(v) for k, v in runs.items()}
    print(f"N = {n}, batches of {BATCH}, {torch.get_num_threads()} threads: forwards {m['forwards']:.2f} s, "
          f"vitviz.similarity {m['library']:.2f} s ({m['library'] / m['forwards']:.2f}x), the command (model load "
          f"included) {m['command']:.2f} s ({m['command'] / m['forwards']:.2f}x)")


def parts(repeats: int) -> None:
    from vitviz.analyses.similarity import MinibatchCKA, gram
    from vitviz.runs.layer_features import LensFeatures

    lens = vitviz.open("bundled", device="cpu")
    side = LensFeatures(lens)
    with tempfile.TemporaryDirectory() as tmp:
        pictures = [load_image(p).image for p in sorted(make_images(Path(tmp), BATCH).iterdir())]
    x = lens.preprocess(pictures)
    features = side.features(x, "tokens")  # 12 x (32, 256 * 384)
    grams = torch.stack([gram(f) for f in features])
    times = {"forward": [], "grams": [], "sums": [], "sums_bootstrap": []}
    for _ in range(repeats):
        times["forward"].append(timed(lambda: lens.trace(x, keep="resid_post")))
        times["grams"].append(timed(lambda: torch.stack([gram(f) for f in features])))
        times["sums"].append(timed(lambda: MinibatchCKA(12, 12, replicates=0).update(grams, grams, same=True)))
        times["sums_bootstrap"].append(timed(lambda: MinibatchCKA(12, 12).update(grams, grams, same=True)))
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f"one minibatch of {BATCH}, 12 x 12, torch {torch.get_num_threads()} threads: forward (trace) "
          f"{m['forward']:.2f} s; Gram matrices {m['grams']:.3f} s ({m['grams'] / m['forward']:.1%}); CKA sums "
          f"{m['sums']:.4f} s ({m['sums'] / m['forward']:.2%}); with the bootstrap {m['sums_bootstrap']:.3f} s "
          f"({m['sums_bootstrap'] / m['forward']:.1%})")


def calibration(samples: int = 60) -> None:
    from vitviz.analyses.similarity import MinibatchCKA, gram

    mixing = torch.randn(48, 20, generator=torch.Generator().manual_seed(999), dtype=torch.float64) / 7
    print("| features | images / minibatch | mean CKA | spread over samples | bootstrap width / 3.92 | ratio "
          "| coverage |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("unrelated", "related"):
        for n, b in ((48, 8), (64, 16), (256, 32)):
            estimates, lows, highs = [], [], []
            for seed in range(samples):
                g = torch.Generator().manual_seed(seed)
                x = torch.randn(n, 48, generator=g, dtype=torch.float64)
                y = torch.randn(n, 20, generator=g, dtype=torch.float64) if kind == "unrelated" else \
                    torch.tanh(x @ mixing) + 0.5 * torch.randn(n, 20, generator=g, dtype=torch.float64)
                acc = MinibatchCKA(1, 1, replicates=200, seed=seed)
                for i in range(0, n, b):
                    acc.update(gram(x[i:i + b])[None], gram(y[i:i + b])[None])
                cka, low, high = (v[0, 0] for v in acc.result())
                estimates.append(cka), lows.append(low), highs.append(high)
            estimates, lows, highs = map(np.array, (estimates, lows, highs))
            truth = 0.0 if kind == "unrelated" else estimates.mean()
            spread, width = estimates.std(), np.mean(highs - lows) / 3.92
            print(f"| {kind} | {n} / {b} | {estimates.mean():.3f} | {spread:.3f} | {width:.3f} | {width / spread:.2f} "
                  f"| {np.mean((lows <= truth) & (truth <= highs)):.0%} |", flush=True)


def memory_of(n: int, folder: Path) -> None:
    lens = vitviz.open("bundled", device="cpu")
    every = sorted(folder.iterdir())
    vitviz.similarity(lens, lens, every[:8], batch_size=BATCH)
    print(peak_extra_mib(lambda: vitviz.similarity(lens, lens, every[:n], batch_size=BATCH)))


if __name__ == "__main__":
    main()
