"""Does a class target change which maps are told apart from chance? (issue 30's number)

The bundled model has no head, so its faithfulness scores a map by the pooled vector's projection (cosine with the
original). A linear probe gives it one: here a 4-class probe "which sample photo is this crop from", trained on the
crops themselves at layer 12 (so the probed model is the whole backbone and only the target differs). Then
``python -m vitviz faithfulness`` runs twice on the same crops, same methods, same protocols (MoRF, LeRF, insertion),
same random seeds (6 fractions and 5 seeds by default, to keep it minutes on 2 cores): once without the head (projection target; score = cosine of the pooled vector) and once with it
(class target = each crop's top-1 probe class; score = its softmax probability). The script prints both summaries'
verdicts against the random floor side by side. Report, do not tune.

The set: each of the four sample photos (assets/*.jpg) gives 5 crops -- the centre and the four corners, each 70 %
of the photo's width and height -- 20 images in 4 classes of 5.

Usage: .venv/bin/python benchmarks/probe_target_faithfulness.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
METHODS = "attnlrp,rollout,legrad,gradcam,gradient,last_layer_mean,random"


def crops(out: Path) -> Path:
    root = out / "crops"
    for photo in sorted((ROOT / "assets").glob("*.jpg")):
        im = Image.open(photo).convert("RGB")
        w, h = im.size
        cw, ch = int(0.7 * w), int(0.7 * h)
        boxes = {"centre": ((w - cw) // 2, (h - ch) // 2), "tl": (0, 0), "tr": (w - cw, 0), "bl": (0, h - ch),
                 "br": (w - cw, h - ch)}
        folder = root / photo.stem
        folder.mkdir(parents=True, exist_ok=True)
        for name, (x, y) in boxes.items():
            im.crop((x, y, x + cw, y + ch)).save(folder / f"{photo.stem}_{name}.png")
    return root


def vitviz(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vitviz", *args], cwd=ROOT, check=True)
    return time.perf_counter() - start


def verdicts(folder: Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    out = {}
    for protocol, block in summary["protocols"].items():
        for row in block["methods"]:
            out[(row["method"], protocol)] = (row["mean"], row.get("vs_random", "-"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("/tmp/vitviz-probe-target"))
    parser.add_argument("--steps", type=int, default=6, help="fractions of each curve (the CLI's default is 11)")
    parser.add_argument("--seeds", type=int, default=5, help="random maps (the CLI's default is 10)")
    args = parser.parse_args()
    root = crops(args.out)
    probe = args.out / "probe" / "probe.safetensors"
    seconds = {"probe": 0.0 if probe.exists() else
               vitviz("probe", str(root), "--folders", "--layer", "12", "--out", str(args.out / "probe"))}
    common = [str(root), "--methods", METHODS, "--protocols", "morf,lerf,insertion", "--batch-size", "4",
              "--steps", str(args.steps), "--random-seeds", str(args.seeds)]
    seconds["projection"] = vitviz("faithfulness", *common, "--out", str(args.out / "projection"))
    seconds["class"] = vitviz("faithfulness", *common, "--head", str(probe),
                              "--out", str(args.out / "class"))
    a, b = verdicts(args.out / "projection"), verdicts(args.out / "class")
    print(f"\n{'method':18s} {'protocol':10s} {'projection AUC':>15s} {'verdict':>10s} {'class AUC':>10s} {'verdict':>10s}")
    for key in sorted(a, key=lambda k: (k[1], k[0])):
        (ma, va), (mb, vb) = a[key], b.get(key, (float("nan"), "-"))
        print(f"{key[0]:18s} {key[1]:10s} {ma:15.3f} {va:>10s} {mb:10.3f} {vb:>10s}")
    print("\nseconds:", {k: round(v, 1) for k, v in seconds.items()})


if __name__ == "__main__":
    main()
