"""Registers (issue 19): does sink masking cost the bundled model's maps their faithfulness?

For each of the four sample photos: deletion and insertion AUC (the Faithfulness page's test with its defaults,
vitviz.perturbation.protocols.protocol_curves: MoRF as deletion, insertion, removed patches the mean colour, 0-100 % of
the patches in steps of 10 %) of rollout (readout, all layers, mean over heads) and AttnLRP
(projection of the pooled vector on its own direction: the bundled model has no head) before and after sink masking
(each layer's patch sinks dropped as keys, rows renormalised, the forward run on; the after curves are scored with
the masking in every forward), each beside the random band (10 seeded maps, mean ± s.d.).

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/registers_faithfulness.py [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vitviz.io.images import load_image  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.analyses.registers import Repair  # noqa: E402
from vitviz.runs.registers_run import repair_faithfulness  # noqa: E402

PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    loaded = load_model(ModelSpec(device=args.device))
    print(f"load average {os.getloadavg()[0]:.1f}; bundled DINOv2-S/14 at 224, sink masking")
    print(f"{'photo':15s} {'method':28s} {'side':7s} {'deletion':>9s} {'insertion':>9s}  verdicts (vs random)")
    for name in PHOTOS:
        t0 = time.perf_counter()
        result = repair_faithfulness(loaded, load_image(ROOT / "assets" / name).image, Repair("sinks"))
        for row in result.table():
            print(f"{name:15s} {row['method']:28s} {row['side']:7s} {row['deletion_auc']:9.3f} {row['insertion_auc']:9.3f}"
                  f"  {row['deletion_vs_random']} / {row['insertion_vs_random']}")
        print(f"{name:15s} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
