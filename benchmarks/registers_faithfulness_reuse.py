"""The Registers' "Faithfulness before and after sink masking" after the Faithfulness page ran: what the button costs
when it recomputes the "before" (as it did) and when it reuses the Faithfulness page's test (as it does now).

Both in the same run, interleaved, on the bundled DINOv2-S/14 at 224 with its sink masking: the Faithfulness page's
test with its defaults (AttnLRP, rollout, 10 random seeds; MoRF, LeRF, insertion; 11 steps) is computed first, as
the user's visit to that page did; then the button's work is timed both ways (``before=None``: both sides;
``before=`` that test: the "after" only). The forwards are counted (deterministic); the seconds are a ratio of the
same run on a shared machine.

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/registers_faithfulness_reuse.py [--photo astronaut.jpg] [--repeats 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import numpy as np  # noqa: E402

import vitviz.perturbation.protocols as protocols  # noqa: E402
import vitviz.runs.registers_run as registers_run  # noqa: E402
from vitviz.analyses.per_image import analyse_images  # noqa: E402
from vitviz.analyses.registers import Repair  # noqa: E402
from vitviz.analyses.rollout import rollout  # noqa: E402
from vitviz.explainers import explain  # noqa: E402
from vitviz.explainers.targets import default_target  # noqa: E402
from vitviz.io.images import load_image  # noqa: E402
from vitviz.lens import Lens  # noqa: E402
from vitviz.perturbation.curves import default_fractions, random_seed_maps  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402

FORWARDS = [0]


def counting_score_inputs(real):
    def score_inputs(model, inputs, score, batch_size=16):
        FORWARDS[0] += len(inputs)
        return real(model, inputs, score, batch_size)
    return score_inputs


def faithfulness_page(loaded, image):
    """The Faithfulness page's test with its defaults (ui/image_faithfulness.py without Streamlit)."""
    lens = Lens(loaded)
    x = preprocess([image], loaded.data_config).tensor[0]
    plain = analyse_images(loaded, [image]).image(0)
    maps = {"attnlrp": explain(lens, x[None], "attnlrp", default_target(loaded.model, None)).patches[0],
            "rollout": rollout(plain.attention, plain.layout).map} | random_seed_maps(loaded.layout.grid_size, 0)
    curves = protocols.protocol_curves(loaded.model, x, maps, loaded.layout, replacement="mean",
                                       fractions=default_fractions(11))
    return curves.faithfulness(maps, loaded.layout.num_patches), plain


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photo", default="astronaut.jpg")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    protocols.score_inputs = counting_score_inputs(protocols.score_inputs)
    loaded = load_model(ModelSpec())
    image = load_image(ROOT / "assets" / args.photo).image
    before, plain = faithfulness_page(loaded, image)
    repair = Repair("sinks")
    print(f"load average {os.getloadavg()[0]:.1f}; bundled DINOv2-S/14 at 224, sink masking, {args.photo}")
    times = {"recompute": [], "reuse": []}
    for _ in range(args.repeats):
        for way in ("recompute", "reuse"):
            FORWARDS[0] = 0
            t0 = time.perf_counter()
            result = registers_run.repair_faithfulness(loaded, image, repair, sinks=[plain.sinks],
                                                       before=before if way == "reuse" else None)
            times[way].append(time.perf_counter() - t0)
            print(f"{way:9s} {times[way][-1]:7.1f} s  {FORWARDS[0]} perturbed/end inputs scored  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            if way == "reuse":
                same = all(np.array_equal(result.before.deletion, before.deletion) for _ in [0])
                print(f"          'before' rows are the page's: {same}")
    r, u = np.median(times["recompute"]), np.median(times["reuse"])
    print(f"median: recompute {r:.1f} s, reuse {u:.1f} s: the button takes {u / r:.2f}x the time ({r - u:.0f} s saved)")


if __name__ == "__main__":
    main()
