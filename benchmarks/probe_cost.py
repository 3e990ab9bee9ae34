"""Cost of training linear probes (vitviz.probes) against the forwards it needs.

The set: seeded random crops (40-90 % of each side, anywhere in the photo) of the four sample photos, each crop
labelled with its photo (4 classes, balanced), saved as PNGs. The model: the bundled DINOv2 ViT-S/14 @224 with its
real weights, float32, batch 8. Measured in the same run, on the same images:

  forward    one plain forward per image (``lens.trace(x, keep="pooled")``, timm's fused path): the baseline;
  features   what ``probes.fit`` runs: one spelled-out forward per image keeping all 12 ``resid_post`` and each
             layer read out through the final norm and pooling (every layer's features at once);
  score      nested stratified cross-validation of all 12 layers (5 outer folds; in each, C chosen among 5 values by a
             3-fold search on the training images), then the head's fit: scikit-learn only, on the features;

for each pooling (cls: D = 384, mean: 384, cls+mean: 768), each row with its own baseline forward measured right
before it, and the accuracy per layer (out-of-fold) for the record.

Usage: .venv/bin/python -u benchmarks/probe_cost.py [--crops 8,24] [--device cpu] [--poolings cls,mean,cls+mean]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import vitviz  # noqa: E402
from vitviz import probes  # noqa: E402
from vitviz.probes.features import layer_features  # noqa: E402
from vitviz.probes.linear import chance, export_head, fit_probe, score_layer  # noqa: E402

SAMPLES = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg")


def crops(folder: Path, per_photo: int, seed: int = 0) -> probes.LabelledImages:
    rng = np.random.default_rng(seed)
    for name in SAMPLES:
        photo = Image.open(ROOT / "assets" / name).convert("RGB")
        W, H = photo.size
        out = folder / Path(name).stem
        out.mkdir(parents=True, exist_ok=True)
        for i in range(per_photo):
            w, h = int(W * rng.uniform(0.4, 0.9)), int(H * rng.uniform(0.4, 0.9))
            x, y = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
            photo.crop((x, y, x + w, y + h)).save(out / f"crop{i}.png")
    return probes.from_folders([folder])


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crops", default="8,24", help="crops per photo, comma-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--poolings", default="cls,mean,cls+mean", help="comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    lens = vitviz.open("bundled", device=args.device)
    print(f"{lens.label} on {lens.device}, torch threads {torch.get_num_threads()}")
    print("| images | pooling | F | forward s | features s | score 12 layers + head s | features / forward | "
          "score / forward | best layer (acc) | chance |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for per_photo in map(int, args.crops.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            images = crops(Path(tmp), per_photo)
            n = len(images.paths)
            x = lens.preprocess(list(images.paths))
            lens.trace(x.tensor[:2], keep="pooled")  # warm-up

            def forward():
                for s in range(0, n, 8):
                    lens.trace(x.tensor[s:s + 8], keep="pooled")

            y = np.asarray(images.targets())
            for pooling in args.poolings.split(","):
                _, t_forward = timed(forward)  # the baseline again right before each row: the load moves
                (features, _), t_features = timed(lambda: layer_features(lens, images, pooling, batch_size=8))

                def score():
                    scores = [score_layer(features[i], y, i + 1) for i in range(len(features))]
                    best = max(scores, key=lambda s: (s.accuracy, -s.layer))
                    export_head(fit_probe(features[best.layer - 1], y)[0], len(images.classes))
                    return scores, best

                (scores, best), t_score = timed(score)
                print(f"| {n} | {pooling} | {features.shape[-1]} | {t_forward:.2f} | {t_features:.2f} | {t_score:.2f} | "
                      f"{t_features / t_forward:.2f} | {t_score / t_forward:.2f} | {best.layer} ({best.accuracy:.2f}) | "
                      f"{chance(y):.2f} |", flush=True)
                if pooling == "cls":
                    print("    accuracy per layer (cls): " + ", ".join(f"{s.layer}: {s.accuracy:.2f} "
                                                                     f"[{s.low:.2f}-{s.high:.2f}]" for s in scores),
                          flush=True)


if __name__ == "__main__":
    main()
