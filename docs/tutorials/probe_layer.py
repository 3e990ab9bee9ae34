"""Tutorial: probe every layer of the bundled model, give it the probe as its head, explain the probe's class.

    .venv/bin/python docs/tutorials/probe_layer.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: probe_accuracy.png (out-of-fold accuracy per layer with
its interval and the chance line) and probe_maps.png (AttnLRP of the probe's class on two photos).
tests/test_docs.py runs it and compares its printed lines with docs/tutorials/probe_layer.txt, which the page shows.
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

# --8<-- [start:data]
# 1. Labelled images: six random crops of each sample photo, one class folder per photo (photos/<class>/*.png).
rng = np.random.default_rng(0)
for name in ("astronaut", "chelsea", "coffee", "rocket"):
    photo = Image.open(f"assets/{name}.jpg").convert("RGB")
    W, H = photo.size
    (work / "photos" / name).mkdir(parents=True)
    for i in range(6):
        w, h = int(W * rng.uniform(0.4, 0.9)), int(H * rng.uniform(0.4, 0.9))
        left, top = int(rng.integers(0, W - w + 1)), int(rng.integers(0, H - h + 1))
        photo.crop((left, top, left + w, top + h)).save(work / "photos" / name / f"crop{i}.png")
images = probes.from_folders([work / "photos"])
print(f"{len(images.paths)} images, classes {images.classes}")
# --8<-- [end:data]

# --8<-- [start:fit]
# 2. A logistic probe on every layer's pooled vector, scored by nested cross-validation (out-of-fold accuracy).
lens = vitviz.open("bundled")
result = probes.fit(lens, images, pooling="cls")
for row in result.table:
    print(f"layer {row['layer']:2d}: accuracy {row['accuracy']:.2f} [{row['low']:.2f}, {row['high']:.2f}]")
print(f"chance {result.chance:.2f}; the head's layer: {result.layer} (the most accurate, the earliest of equals)")
# --8<-- [end:fit]

# --8<-- [start:head]
# 3. The probe as the model's head: the backbone's first `layer` blocks, its final norm and pooling, then the probe.
result = result.at_layer(12)  # the whole model: every block takes part in the explanation below
weights = result.save(work / "probe")
headed = vitviz.open("bundled", head=str(weights))
print(f"headed: {headed.num_layers} blocks, {headed.num_classes} classes {headed.class_labels}")
x = headed.preprocess(["assets/chelsea.jpg", "assets/rocket.jpg"])
logits = headed.trace(x, keep=("logits",))["logits"]
for source, row in zip(x.sources, logits.softmax(-1)):
    print(f"{source.name}: top-1 {headed.class_labels[int(row.argmax())]} ({float(row.max()):.2f})")
# --8<-- [end:head]

# --8<-- [start:explain]
# 4. Explain the probe's class: which pixels raised the logit of "chelsea" on chelsea.jpg, of "rocket" on rocket.jpg.
maps = []
for i, name in enumerate(("chelsea", "rocket")):
    target = vitviz.ClassLogit(headed.class_labels.index(name), labels=headed.class_labels)
    maps.append(vitviz.explain(headed, x.tensor[i:i + 1], "attnlrp", target=target))
    logit = float(logits[i, target.cls])
    print(f"{x.sources[i].name}: explained the {maps[-1].target.text()} = {logit:.2f}, "
          f"map {tuple(maps[-1].pixels.shape)}, signed={maps[-1].signed}")
# --8<-- [end:explain]

fig, ax = plt.subplots(figsize=(5, 3.2))
table = result.table
layers = [r["layer"] for r in table]
accuracy = np.array([r["accuracy"] for r in table])
ax.fill_between(layers, [r["low"] for r in table], [r["high"] for r in table], alpha=0.25, label="95% interval")
ax.plot(layers, accuracy, marker="o", label="out-of-fold accuracy")
ax.axhline(result.chance, color="grey", linestyle="--", label="chance")
ax.set_xlabel("layer (1-based)")
ax.set_ylabel("accuracy")
ax.set_ylim(0, 1.05)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(args.out / "probe_accuracy.png", dpi=110)

fig, axes = plt.subplots(1, 4, figsize=(11, 3.0))
for i, (m, c) in enumerate(zip(maps, ("chelsea", "rocket"))):
    axes[2 * i].imshow(x.images[i])
    axes[2 * i].set_title(x.sources[i].name, fontsize=9)
    top = float(np.percentile(np.abs(m.pixels[0]), 99))
    axes[2 * i + 1].imshow(m.pixels[0], cmap="RdBu_r", vmin=-top, vmax=top)
    axes[2 * i + 1].set_title(f'AttnLRP of the probe\'s "{c}"', fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "probe_maps.png", dpi=110)
print("wrote probe_accuracy.png and probe_maps.png")
