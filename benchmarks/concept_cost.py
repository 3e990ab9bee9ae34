"""A painted concept on the sample photos (vitviz.probes.concepts): accuracy per layer, and the cost against the
forwards it needs.

The concept: the cat's eyes in chelsea.jpg, painted on the bundled model's 16x16 grid at 224 px (0-based rows and
columns): the left eye rows 5-7 x columns 3-6, the right eye rows 6-8 x columns 11-14 (24 patches; the other 232
patches of chelsea are not concept). Two paintings:

  A  chelsea only: one painted image, its patches held out in 2x2 blocks; astronaut, coffee and rocket are mapped;
  B  chelsea and the astronaut's eyes (row 3, columns 5-7: 3 patches): two painted images, each held out in turn.

Measured in the same run, on the same four photos (float32, batch 4):

  forward   one plain forward of the four photos (``lens.trace(x, keep="pooled")``): the baseline;
  tokens    what ``fit_concept`` runs: one spelled-out forward keeping all 12 ``resid_post``;
  fit       the whole ``fit_concept`` (tokens, 12 layers' out-of-fold scores, 12 probes on all painted patches,
            the probability maps of the four photos);
  attnlrp   AttnLRP of chelsea with ``ConceptTarget`` at the readable layer, against AttnLRP of the default
            target (the pooled vector's projection), each timed after a warm-up.

Usage: .venv/bin/python -u benchmarks/concept_cost.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import vitviz  # noqa: E402
from vitviz.probes.concepts import ConceptTarget, PaintedImages, fit_concept, patch_tokens  # noqa: E402

SAMPLES = ("chelsea.jpg", "astronaut.jpg", "coffee.jpg", "rocket.jpg")


def cat_eyes() -> np.ndarray:
    m = np.zeros((16, 16), bool)
    m[5:8, 3:7] = True
    m[6:9, 11:15] = True
    return m


def astronaut_eyes() -> np.ndarray:
    m = np.zeros((16, 16), bool)
    m[3, 5:8] = True
    return m


def best_of(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3, help="each timing is the best of this many")
    args = parser.parse_args()
    lens = vitviz.open("bundled", device="cpu")
    paths = [str(ROOT / "assets" / s) for s in SAMPLES]
    x = lens.preprocess(paths)
    lens.trace(x, keep="pooled")  # warm-up
    print(f"{lens.label} on {lens.device}, torch threads {torch.get_num_threads()}, best of {args.repeats}")
    paintings = {"A (chelsea only)": [cat_eyes(), None, None, None],
                 "B (chelsea + astronaut)": [cat_eyes(), astronaut_eyes(), None, None]}
    print("| painting | forward s | tokens s | fit s | tokens / forward | fit / forward |")
    print("|---|---|---|---|---|---|")
    results = {}
    for name, concept in paintings.items():
        painted = PaintedImages.of(paths, concept, names=list(SAMPLES))
        _, t_forward = best_of(lambda: lens.trace(x, keep="pooled"), args.repeats)
        _, t_tokens = best_of(lambda: patch_tokens(lens, painted, batch_size=4), args.repeats)
        result, t_fit = best_of(lambda: fit_concept(lens, painted, batch_size=4), args.repeats)
        results[name] = result
        print(f"| {name} | {t_forward:.2f} | {t_tokens:.2f} | {t_fit:.2f} | {t_tokens / t_forward:.2f} | "
              f"{t_fit / t_forward:.2f} |", flush=True)
    for name, result in results.items():
        print(f"\n{name}: hold-out {result.holdout}; readable (balanced accuracy >= 0.9 to the last layer) from layer "
              f"{result.readable_from(0.9)}")
        print("    balanced accuracy per layer: " + ", ".join(f"{s.layer}: {s.balanced_accuracy:.3f}"
                                                            for s in result.layers))
        print("    accuracy per layer: " + ", ".join(f"{s.layer}: {s.accuracy:.3f}" for s in result.layers)
              + f" (chance {result.chance:.3f})")
    a = results["A (chelsea only)"]
    eyes = astronaut_eyes()
    print("\nA's probe on the astronaut (never painted): mean probability on her eyes (row 3, columns 5-7) / on her "
          "other patches, per layer: " + ", ".join(
              f"{l + 1}: {a.probability[1, l][eyes].mean():.2f}/{a.probability[1, l][~eyes].mean():.2f}"
              for l in range(a.num_layers)))
    print("A's probe: patches over 0.5 on astronaut / coffee / rocket, per layer: " + ", ".join(
        f"{l + 1}: " + "/".join(str(int((a.probability[i, l] > 0.5).sum())) for i in (1, 2, 3))
        for l in range(a.num_layers)))
    layer = a.readable_from(0.9) or a.num_layers
    xc = x.tensor[:1]
    concept = ConceptTarget(a, layer)
    vitviz.explain(lens, xc, "attnlrp", target=concept)  # warm-up
    m, t_concept = best_of(lambda: vitviz.explain(lens, xc, "attnlrp", target=concept), args.repeats)
    _, t_default = best_of(lambda: vitviz.explain(lens, xc, "attnlrp"), args.repeats)
    share = m.conservation()[0]["pixel_share"]
    print(f"\nAttnLRP of chelsea, concept at layer {layer}: {t_concept:.2f} s; default target (projection): "
          f"{t_default:.2f} s; ratio {t_concept / t_default:.2f}; concept value {m.target_value[0]:.1f}, pixel "
          f"share {share:.3f}")


if __name__ == "__main__":
    main()
