"""Tutorial: train a small sparse autoencoder (SAE) on one layer's patch tokens and browse its features.

    .venv/bin/python docs/tutorials/sae_features.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: sae_image.png (the strongest latents of chelsea.jpg as
maps over its patches) and sae_latent.png (one latent over every photo, and AttnLRP of what made it fire).
tests/test_docs.py runs it and compares its printed lines with docs/tutorials/sae_features.txt, which the page shows.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageOps  # noqa: E402

import vitviz  # noqa: E402
from vitviz.features import SAE, LatentTarget, evaluate  # noqa: E402
from vitviz.features.browse import encode_images  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("."))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)

# --8<-- [start:tokens]
# 1. Tokens: layer 9's patch tokens (blocks.8.resid_post, 0-based in the name) of three photos, eight random crops
#    of each and all of them mirrored: 54 images, 13,824 tokens. coffee.jpg is held out.
lens = vitviz.open("bundled")
rng = np.random.default_rng(0)
train_images = []
for name in ("astronaut", "chelsea", "rocket"):
    photo = Image.open(f"assets/{name}.jpg").convert("RGB")
    W, H = photo.size
    for i in range(9):
        w, h = (W, H) if i == 0 else (int(W * rng.uniform(0.5, 0.9)), int(H * rng.uniform(0.5, 0.9)))
        left, top = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
        crop = photo.crop((left, top, left + w, top + h))
        train_images += [crop, ImageOps.mirror(crop)]
POINT, LAYER = "blocks.8.resid_post", 9


def patch_tokens(images):
    """(n * 256, 384) the patch tokens of the images at POINT, 8 images per forward."""
    out = []
    for s in range(0, len(images), 8):
        trace = lens.trace(lens.preprocess(images[s:s + 8]), keep=[("resid_post", LAYER - 1)])
        out.append(trace["resid_post", LAYER - 1][:, trace.layout.patch_slice].flatten(0, 1))
    return torch.cat(out)


tokens = patch_tokens(train_images)
held_out = patch_tokens(["assets/coffee.jpg"])
print(f"{len(train_images)} training images, tokens {tuple(tokens.shape)}; held out: coffee.jpg {tuple(held_out.shape)}")
# --8<-- [end:tokens]

# --8<-- [start:train]
# 2. A TopK SAE: 512 latents, 16 active per token, 10 epochs of Adam (seconds on a CPU).
sae = SAE.fit(tokens, latents=512, topk=16, epochs=10, seed=0,
              info={"point": POINT, "point_kind": "resid_post", "layer": LAYER})
seen, unseen = evaluate(sae, tokens), evaluate(sae, held_out)
print(f"explained variance: {seen['explained_variance']:.2f} on its training tokens, "
      f"{unseen['explained_variance']:.2f} on coffee.jpg (never seen)")
print(f"L0 {seen['l0']:.1f} latents per token; dead: {seen['dead_fraction']:.2f} of the latents")
# --8<-- [end:train]

# --8<-- [start:browse]
# 3. Browse: encode every photo, chelsea.jpg's strongest latents, then one latent's strongest patch in each photo.
photos = [f"assets/{n}.jpg" for n in ("astronaut", "chelsea", "coffee", "rocket")]
codes = encode_images(lens, sae, photos, POINT)
strongest = codes.top_latents(1, n=4, by="sum")  # image 1 = chelsea.jpg; by activation summed over its patches
print(f"chelsea.jpg's strongest latents: {strongest.tolist()}")
latent = int(strongest[0])
print(f"latent {latent} fires on {codes.frequency(latent):.3f} of the photos' patches")
for image, patch, activation in codes.top_patches(latent, n=4):
    row, column = divmod(patch, codes.grid[1])
    print(f"  {Path(photos[image]).name:13s} strongest at patch row {row:2d}, column {column:2d}: {activation:.2f}")
# --8<-- [end:browse]

# --8<-- [start:explain]
# 4. Which pixels made the latent fire on chelsea.jpg: any map method that takes a target, here AttnLRP.
x = lens.preprocess(["assets/chelsea.jpg"])
m = vitviz.explain(lens, x, "attnlrp", target=LatentTarget(sae, latent, num_prefix_tokens=lens.layout.num_prefix_tokens))
print(f"attnlrp of latent {latent}: {tuple(m.pixels.shape)} pixels, signed={m.signed}")
# --8<-- [end:explain]

model_images = [lens.preprocess([p]).images[0] for p in photos]
extent = (0, 224, 224, 0)
maps = codes.image_maps(1)  # (K, 16, 16)
fig, axes = plt.subplots(1, 5, figsize=(13, 2.9))
axes[0].imshow(model_images[1])
axes[0].set_title("chelsea.jpg", fontsize=9)
for ax, j in zip(axes[1:], strongest):
    ax.imshow(model_images[1])
    ax.imshow(np.ma.masked_equal(maps[j], 0), cmap="inferno", alpha=0.8, extent=extent, interpolation="nearest")
    ax.set_title(f"latent {j} (sum {maps[j].sum():.1f})", fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "sae_image.png", dpi=110)

across = codes.latent_maps(latent)  # (4, 16, 16)
fig, axes = plt.subplots(1, 5, figsize=(13, 2.9))
for ax, image, path, values in zip(axes, model_images, photos, across):
    ax.imshow(image)
    ax.imshow(np.ma.masked_equal(values, 0), cmap="inferno", vmin=0, vmax=float(across.max()), alpha=0.8,
              extent=extent, interpolation="nearest")
    ax.set_title(f"latent {latent} on {Path(path).name}", fontsize=9)
top = float(np.percentile(np.abs(m.pixels[0]), 99))
axes[4].imshow(m.pixels[0], cmap="RdBu_r", vmin=-top, vmax=top)
axes[4].set_title(f"AttnLRP of latent {latent}, chelsea.jpg", fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "sae_latent.png", dpi=110)
print("wrote sae_image.png and sae_latent.png")
