"""Do a latent's nearest classes (vitviz.features.classes, a logit lens on its decoder row) name what it fires on?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/features_nearest_classes.py SAE_DIR [SAE_DIR ...] --head PROBE
        --views VIEWS_DIR

VIEWS_DIR holds one folder per class (``astronaut/ cat/ coffee/ rocket/``: the 22 views of each photo of assets/ that
benchmarks/features_heldout.py makes), PROBE a probe head trained on them (``python -m vitviz probe VIEWS_DIR
--folders --layer 12``). For every latent of each SAE: the share of its summed activation over the views that falls on
each class's views; a latent is *selective* when one class holds >= 80 % of it. Reported: how often a selective
latent's nearest class is that class (chance: 1 / classes), per SAE layer.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(saes: list[Path], head: Path, views: Path, share: float = 0.8) -> None:
    import vitviz
    from vitviz.features import SAE
    from vitviz.features.classes import class_cosines
    from vitviz.features.top import point_of

    lens = vitviz.open("bundled", device="cpu", head=head)
    classes = list(lens.class_labels)
    files = {c: sorted((views / c).glob("*.jpg")) for c in classes}
    print("| SAE layer | K | k | selective latents (>= 80 % on one class) | nearest class = that class | chance |")
    print("|---|---|---|---|---|---|")
    for folder in saes:
        sae = SAE.load(folder)
        kind, layer = point_of(sae)
        point = f"blocks.{layer - 1}.{kind}"
        mass = np.zeros((len(classes), sae.latents))
        with torch.no_grad():
            for c, paths in enumerate(files.values()):
                for s in range(0, len(paths), 8):
                    t = lens.trace(lens.preprocess(paths[s:s + 8]), keep=[point], stop_after=point)[point]
                    mass[c] += sae.encode(t[:, lens.layout.patch_slice].float()).sum((0, 1)).double().numpy()
        total = mass.sum(0)
        fired = total > 0
        shares = np.where(fired, mass / np.where(fired, total, 1), 0)
        selective = np.flatnonzero(shares.max(0) >= share)
        near = class_cosines(lens, sae, selective).argmax(1)
        agree = float((near == shares[:, selective].argmax(0)).mean()) if len(selective) else float("nan")
        print(f"| {layer} | {sae.latents} | {sae.topk} | {len(selective)} of {int(fired.sum())} that fired | "
              f"{agree:.1%} | {1 / len(classes):.0%} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("saes", nargs="+", type=Path)
    parser.add_argument("--head", type=Path, required=True)
    parser.add_argument("--views", type=Path, required=True)
    args = parser.parse_args()
    main(args.saes, args.head, args.views)
