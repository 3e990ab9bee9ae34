"""Tutorial: open the bundled model, trace one photo, explain it with rollout and AttnLRP, score the maps.

    .venv/bin/python docs/tutorials/first_maps.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: maps.png (the photo, rollout and AttnLRP) and
deletion.png (the model's score as the patches each map ranks first are deleted). tests/test_docs.py runs it and
compares its printed lines with docs/tutorials/first_maps.txt, which the tutorial page shows.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import vitviz  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("."))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

# --8<-- [start:trace]
# 1. Open a model and trace one photo: every layer's attention, kept as (B, H, N, N) per layer.
lens = vitviz.open("bundled")
x = lens.preprocess(["assets/chelsea.jpg"])
trace = lens.trace(x, keep=("attn",))
layout = trace.layout
print(f"{lens.label}: {layout.grid_size[0]}x{layout.grid_size[1]} patches, prefix tokens {layout.prefix_tokens}")
last = trace["attn", -1][0]  # layer 12 on screen (0-based -1): (H, N, N)
print(f"layer 12: the CLS token gives {float(last[:, 0, 1:].sum(-1).mean()):.2f} of its attention to the patches")
# --8<-- [end:trace]

# --8<-- [start:maps]
# 2. Two maps of the same image: attention rollout (non-negative) and AttnLRP (signed relevance).
rollout = vitviz.explain(lens, x, "rollout")
attnlrp = vitviz.explain(lens, x, "attnlrp")
print(f"rollout: {tuple(rollout.patches.shape)} patches, signed={rollout.signed}")
print(f"attnlrp: {tuple(attnlrp.pixels.shape)} pixels, signed={attnlrp.signed}, target: {attnlrp.target.text()}")
# --8<-- [end:maps]

fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
image = x.images[0]
axes[0].imshow(image)
axes[0].set_title("chelsea.jpg as the model sees it", fontsize=9)
extent = (0, image.size[0], image.size[1], 0)
axes[1].imshow(image)
axes[1].imshow(rollout.patches[0], cmap="inferno", alpha=0.7, extent=extent, interpolation="nearest")
axes[1].set_title("rollout (0 to its maximum)", fontsize=9)
relevance = attnlrp.pixels[0]
top = float(np.percentile(np.abs(relevance), 99))  # as the app scales signed maps: ± the 99th percentile
axes[2].imshow(relevance, cmap="RdBu_r", vmin=-top, vmax=top)
axes[2].set_title("AttnLRP (red raises the target, blue lowers it)", fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "maps.png", dpi=110)

# --8<-- [start:score]
# 3. Which map to trust: delete the patches each map ranks first and watch the model's score fall.
tables = vitviz.faithfulness(lens, x, methods=["rollout", "attnlrp", "random"], protocols=("morf",), steps=6,
                             random_seeds=2)
aucs = tables.aucs.groupby("method")["auc"].mean()
for method in ("attnlrp", "rollout", "random"):
    print(f"deletion AUC {method}: {aucs[method]:.2f} (lower = the map found what matters)")
# --8<-- [end:score]

fig, ax = plt.subplots(figsize=(5, 3.2))
for method, curve in tables.curves.groupby("method"):
    if method.startswith("random_seed"):  # the seeds' mean is "random"
        continue
    mean = curve.groupby("fraction")["score"].mean()
    ax.plot(mean.index, mean.values, marker="o", label=method)
ax.set_xlabel("share of patches deleted")
ax.set_ylabel("score (cosine to the original)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(args.out / "deletion.png", dpi=110)
print("wrote maps.png and deletion.png")
