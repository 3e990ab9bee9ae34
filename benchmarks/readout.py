"""Cost of the readout (vitviz.residual) against the plain forward, and what ablating the top heads does.

The model: the bundled DINOv2 ViT-S/14 @224 (real weights, float32) with a probe head fitted here on the four sample
photos' crops (4 classes, layer 12, cls+mean: what `vitviz probe` trains), so the target is a real class logit.
Measured in the same run, on the same images, each row with its own baseline right before it (median of repeats,
CPU time of one torch thread, so other processes on a loaded machine do not enter the ratios):

  forward       ``lens.trace(x, keep="logits")``: the plain forward (timm's fused path): the baseline;
  readout       ``vitviz.readout(lens, x)``: every head's, MLP's, bias's share, with per-source patch shares;
  readout -src  the same without the per-source shares (sources=False);
  logit lens    ``vitviz.logit_lens(lens, x)`` (every block read through the head);
  lens/patch    ``vitviz.logit_lens(lens, x, per_patch=True)`` (every token of every block read alone);
  names         ``vitviz.residual.direct_vectors(lens, x)``: every component toward every class (heads' names);

for one image and for a batch of 8; the peak memory each adds over the process (VmHWM); then, on the four photos,
the top three heads by |direct share|: their direct share beside the total effect of zeroing their z and running on.

Usage: .venv/bin/python -u benchmarks/readout.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import torch  # noqa: E402

import vitviz  # noqa: E402
from _memory import peak_extra_mib  # noqa: E402
from probe_cost import SAMPLES, crops  # noqa: E402
from vitviz import probes, residual  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time of one thread: the machine's other load does not enter the ratios
    with tempfile.TemporaryDirectory() as tmp:
        labelled = crops(Path(tmp) / "crops", per_photo=6)
        backbone = vitviz.open("bundled", device="cpu")
        result = probes.fit(backbone, labelled, pooling="cls+mean", layer=12)
        result.save(Path(tmp) / "probe")
        lens = vitviz.open("bundled", device="cpu", head=str(Path(tmp) / "probe" / "probe.safetensors"))
        print(f"probe: layer {result.layer}, classes {result.classes}")
        photos = [str(ROOT / "assets" / n) for n in SAMPLES]
        for batch in (1, 8):
            x = lens.preprocess((photos * 2)[:batch])
            rows = {
                "readout": lambda: vitviz.readout(lens, x),
                "readout -src": lambda: vitviz.readout(lens, x, sources=False),
                "logit lens": lambda: vitviz.logit_lens(lens, x),
                "lens/patch": lambda: vitviz.logit_lens(lens, x, per_patch=True),
                "names": lambda: residual.direct_vectors(lens, x),
            }
            for name, fn in rows.items():
                fn()  # warm
                base = timed(lambda: lens.trace(x, keep="logits"), args.repeats)
                cost = timed(fn, args.repeats)
                memory = peak_extra_mib(fn)
                print(f"batch {batch:2d} {name:13s} {cost * 1000:8.0f} ms  forward {base * 1000:6.0f} ms  "
                      f"ratio {cost / base:6.1f}x  peak +{memory:6.0f} MiB", flush=True)
        x = lens.preprocess(photos)
        r = vitviz.readout(lens, x, sources=False)
        top = r.top_heads(3)
        effects = vitviz.head_effects(lens, x, heads=[(l, h) for l, h, _ in top])
        print(f"target: {r.target.text()}; largest |total - parts| {abs(r.residual).max():.2e} "
              f"(of totals {', '.join(f'{t:.3f}' for t in r.total)})")
        for row in effects.itertuples():
            print(f"{SAMPLES[row.image]:14s} layer {row.layer + 1:2d} head {row.head + 1}: direct {row.direct:+.4f}  "
                  f"total (zeroed, run on) {row.total:+.4f}")


if __name__ == "__main__":
    main()
