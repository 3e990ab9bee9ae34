"""SAE quality on held-out photos (issue 31): explained variance and L0 against K and k, on the training tokens and on
a photo the SAE never saw, side by side. Report, not tuning.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/features_heldout.py [--folds rocket,chelsea,astronaut,coffee] [--json out.json]

Images: the four photos in assets/ (astronaut, chelsea, coffee, rocket) and 22 views of each: the whole photo, five
crops of 75 % of its side and five of 50 % (the four corners and the centre), each also mirrored left-right; every
view is then resized and centre-cropped the model's way (224 px), so a 50 % crop is a 2x zoom. Bundled DINOv2
ViT-S/14, layer 9 (1-based) resid_post, patch tokens (256 per view).

Folds: one photo held out (all 22 of its views are evaluated, none is trained on), the SAE trained on the other
three photos, two ways:
- ``plain``: their three original views (768 tokens), 50 epochs (38,400 token steps; the earlier table's setting);
- ``augmented``: their 66 views (16,896 tokens), 3 epochs (50,688 token steps: about the same budget).

Explained variance is given two ways, because a single photo's tokens vary much less around their own mean than a
set's tokens do around the set's mean:
- ``EV own mean`` = 1 − Σ‖x − x̂‖² / Σ‖x − mean(x)‖², the mean of the tokens evaluated (:func:`vitviz.features.evaluate`:
  what the earlier table reported);
- ``EV train mean`` = 1 − Σ‖x − x̂‖² / Σ‖x − μ_train‖², μ_train the training tokens' mean: the SAE against the
  best constant it could have learnt from its data (an SAE with no latents, x̂ = b_dec).
L0 = mean latents > 0 per token (TopK with ReLU: at most k).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ASSETS = sorted((ROOT / "assets").glob("*.jpg"))
LAYER, POINT = 9, "blocks.8.resid_post"


def views(image):
    """22 PIL views of one photo: whole, 5 crops at 75 % and 5 at 50 % of its side (corners and centre), each also
    mirrored."""
    from PIL import ImageOps

    w, h = image.size
    out = [image]
    for share in (0.75, 0.5):
        cw, ch = int(w * share), int(h * share)
        for x0, y0 in ((0, 0), (w - cw, 0), (0, h - ch), (w - cw, h - ch), ((w - cw) // 2, (h - ch) // 2)):
            out.append(image.crop((x0, y0, x0 + cw, y0 + ch)))
    return out + [ImageOps.mirror(v) for v in out]


def tokens_of(lens, images, batch: int = 8) -> torch.Tensor:
    """(n_images, 256, 384) patch tokens at the point."""
    parts = []
    for s in range(0, len(images), batch):
        trace = lens.trace(lens.preprocess(images[s:s + batch]), keep=[POINT], stop_after=POINT)
        parts.append(trace[POINT][:, trace.layout.patch_slice].float())
    return torch.cat(parts)


@torch.no_grad()
def scores(sae, x: torch.Tensor, train_mean: torch.Tensor) -> dict:
    from vitviz.features import evaluate

    m = evaluate(sae, x)
    x_hat, _ = sae(x)
    err = float((x - x_hat).double().pow(2).sum())
    return {"ev_own": m["explained_variance"], "ev_train_mean": 1 - err / float((x - train_mean).double().pow(2).sum()),
            "l0": m["l0"], "dead": m["dead_fraction"], "tokens": m["tokens"]}


def main(folds: list[str], latents=(256, 1024, 4096), topks=(8, 32)) -> list[dict]:
    import vitviz
    from vitviz.features import SAE
    from vitviz.io.images import load_image

    torch.manual_seed(0)
    lens = vitviz.open("bundled", device="cpu")
    t = time.perf_counter()
    per_photo = {p.stem: tokens_of(lens, views(load_image(p).image)) for p in ASSETS}  # (22, 256, 384) each
    print(f"tokens of {len(ASSETS)} x 22 views: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    rows = []
    print("| held out | training | K | k | EV train (own mean) | EV held out (own mean) | EV held out (train mean) "
          "| L0 train | L0 held out | dead (train) | fit s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for held in folds:
        others = [s for s in per_photo if s != held]
        test = per_photo[held].reshape(-1, 384)
        sets = {"plain": (torch.cat([per_photo[s][0] for s in others]), 50),
                "augmented": (torch.cat([per_photo[s].reshape(-1, 384) for s in others]), 3)}
        for name, (train, epochs) in sets.items():
            mean = train.double().mean(0).float()
            for K in latents:
                for k in topks:
                    t = time.perf_counter()
                    sae = SAE.fit(train, latents=K, topk=k, seed=0, epochs=epochs, batch_size=256)
                    sec = time.perf_counter() - t
                    a, b = scores(sae, train, mean), scores(sae, test, mean)
                    row = {"held_out": held, "training": name, "train_tokens": len(train), "epochs": epochs, "K": K,
                           "k": k, "train": a, "held": b, "fit_s": sec}
                    rows.append(row)
                    print(f"| {held} | {name} ({len(train)} tokens) | {K} | {k} | {a['ev_own']:.3f} | {b['ev_own']:.3f} "
                          f"| {b['ev_train_mean']:.3f} | {a['l0']:.1f} | {b['l0']:.1f} | {a['dead']:.1%} | {sec:.0f} |",
                          flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--folds", default="rocket,chelsea,astronaut,coffee", help="photos held out, one fold each (stems)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    result = main(args.folds.split(","))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
