"""Tutorial: what each head, MLP and patch wrote into a probe's logit (vitviz.readout), and the logit lens.

    .venv/bin/python docs/tutorials/readout_parts.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: readout_heads.png (what the three heads that write most
moved from each patch of chelsea.jpg into its class's logit) and logit_lens.png (each photo's class probability read
after every block). tests/test_docs.py runs it and compares its printed lines with docs/tutorials/readout_parts.txt,
which the tutorial page shows.
"""
import argparse
import atexit
import shutil
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import vitviz  # noqa: E402
from vitviz import probes  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("."))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix="vitviz-tutorial-"))  # the crops and the probe files
atexit.register(shutil.rmtree, work, ignore_errors=True)
NAMES = ("astronaut", "chelsea", "coffee", "rocket")

# --8<-- [start:probe]
# 1. A head to read out: the bundled model has no classifier, so a probe on layer 12 (cls+mean pooling) trained on
#    six random crops of each sample photo, one class per photo (the "Probe a layer" tutorial explains the steps).
rng = np.random.default_rng(0)
for name in NAMES:
    photo = Image.open(f"assets/{name}.jpg").convert("RGB")
    W, H = photo.size
    (work / "photos" / name).mkdir(parents=True)
    for i in range(6):
        w, h = int(W * rng.uniform(0.4, 0.9)), int(H * rng.uniform(0.4, 0.9))
        left, top = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
        photo.crop((left, top, left + w, top + h)).save(work / "photos" / name / f"crop{i}.png")
backbone = vitviz.open("bundled")
result = probes.fit(backbone, probes.from_folders([work / "photos"]), pooling="cls+mean", layer=12)
lens = vitviz.open("bundled", head=str(result.save(work / "probe")))
print(f"head: a probe on layer {result.layer}, classes {lens.class_labels}")
# --8<-- [end:probe]

# --8<-- [start:readout]
# 2. Split each photo's top-1 logit into the embedding, every head (L x H), every attention bias and MLP, a constant.
x = lens.preprocess([f"assets/{name}.jpg" for name in NAMES])
r = vitviz.readout(lens, x)
for b, name in enumerate(r.images):
    print(f"{name:13s} {r.target.labels[r.target.classes[b]]:9s} logit {r.total[b]:+.2f} = heads "
          f"{r.heads[b].sum():+.2f} + MLPs {r.mlp[b].sum():+.2f} + embedding and biases "
          f"{r.embed[b] + r.attn_bias[b].sum() + r.bias[b]:+.2f}")
print(f"the parts add up to each logit within 1e-5: {bool(np.abs(r.residual).max() < 1e-5)}")
# --8<-- [end:readout]

# --8<-- [start:heads]
# 3. The heads that write most into chelsea.jpg's logit, and what each moved from each patch (0-based in code).
top = r.top_heads(3, image=1)
for layer, head, value in top:
    shares = r.patches(layer, head)[1]  # (16, 16): sums to the head's share minus what it read from the CLS token
    print(f"layer {layer + 1:2d} head {head + 1}: {value:+.2f} of the logit, "
          f"{shares.sum():+.2f} of it read from the patches")
effects = vitviz.head_effects(lens, x.tensor[1:2], heads=[(layer, head) for layer, head, _ in top])
for row in effects.itertuples():
    print(f"layer {row.layer + 1:2d} head {row.head + 1}: direct {row.direct:+.2f}, "
          f"total when zeroed and run on {row.total:+.2f}")
# --8<-- [end:heads]

# --8<-- [start:lens]
# 4. The logit lens: the probe's head read after every block; from which layer on is each photo's class on top?
ll = vitviz.logit_lens(lens, x)
probability = ll.probabilities()  # (B, L, C)
for b, name in enumerate(ll.images):
    final = int(ll.logits[b, -1].argmax())
    top1 = ll.logits[b].argmax(-1) == final  # (L,)
    first = next(l for l in range(len(top1)) if top1[l:].all())
    print(f"{name:13s} {ll.label(final)} is top-1 from layer {first + 1} on; "
          f"probability at layers 4, 8, 12: {', '.join(f'{probability[b, l, final]:.2f}' for l in (3, 7, 11))}")
# --8<-- [end:lens]

fig, axes = plt.subplots(1, 4, figsize=(11, 3.0))
image = x.images[1]
extent = (0, image.size[0], image.size[1], 0)
axes[0].imshow(image)
axes[0].set_title(f"chelsea.jpg: logit {r.total[1]:+.2f}", fontsize=9)
scale = max(float(np.abs(r.patches(layer, head)[1]).max()) for layer, head, _ in top)  # one scale for the three
for ax, (layer, head, value) in zip(axes[1:], top):
    ax.imshow(image)
    ax.imshow(r.patches(layer, head)[1], cmap="RdBu_r", vmin=-scale, vmax=scale, alpha=0.75, extent=extent,
              interpolation="nearest")
    ax.set_title(f"layer {layer + 1} head {head + 1}: {value:+.2f}", fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "readout_heads.png", dpi=110)

fig, ax = plt.subplots(figsize=(5, 3.2))
layers = np.arange(1, probability.shape[1] + 1)
for b, name in enumerate(ll.images):
    final = int(ll.logits[b, -1].argmax())
    ax.plot(layers, probability[b, :, final], marker="o", label=f"{name}: {ll.label(final)}")
ax.axhline(1 / probability.shape[2], color="grey", linestyle="--", label="uniform")
ax.set_xlabel("read after block (1-based)")
ax.set_ylabel("probability of the final class")
ax.set_ylim(0, 1)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(args.out / "logit_lens.png", dpi=110)
print("wrote readout_heads.png and logit_lens.png")
