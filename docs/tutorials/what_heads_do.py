"""Tutorial: what each head does: its queries and keys in one picture, heads switched off, heads swapped.

    .venv/bin/python docs/tutorials/what_heads_do.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: heads_qk.png (one head's queries and keys over the four
sample photos, projected together) and heads_effects.png (how far the output moves when each head is ablated, and
when each head is patched from another image). tests/test_docs.py runs it and compares its printed lines with
docs/tutorials/what_heads_do.txt, which the tutorial page shows.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import vitviz  # noqa: E402
from vitviz.heads import patching, qk  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("."))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

# --8<-- [start:qk]
# 1. Queries and keys: every token's query and key of each head of layer 12 (0-based 11) over the four photos,
#    corrected as AttentionViz does (exact on the softmax) and projected together by PCA.
lens = vitviz.open("bundled")
x = lens.preprocess([f"assets/{n}.jpg" for n in ("astronaut", "chelsea", "coffee", "rocket")])
pictures = qk.layer_pictures(lens, x, layer=11, projection="pca")
for row in pictures.correlations():
    print(f"layer {row['layer']} head {row['head']}: distance-dot correlation {row['correlation_before']:+.2f} "
          f"raw, {row['correlation_after']:+.2f} corrected")
# --8<-- [end:qk]

# --8<-- [start:ablate]
# 2. Ablation: each head of layers 9-12 set to its mean over the four photos, one at a time; 1 - the cosine of the
#    pooled vector to the unedited one says how far the output moved.
L, H = lens.num_layers, 6
pairs = [(layer, head) for layer in range(8, 12) for head in range(H)]  # 0-based
ablated = patching.ablate(lens, x, pairs, mode="mean")
moved = np.mean([1 - ablated.grid("pooled_cosine", L, H, image=i) for i in range(4)], axis=0)  # (L, H), NaN: not run
for flat in np.argsort(-np.nan_to_num(moved, nan=-1), axis=None)[:3]:
    layer, head = divmod(int(flat), H)
    print(f"ablating layer {layer + 1} head {head + 1} moves the pooled vector by {moved[layer, head]:.3f} "
          f"(1 - cosine, mean of 4 photos)")
# --8<-- [end:ablate]

# --8<-- [start:patch]
# 3. Activation patching: run coffee.jpg (B) with one head's context taken from chelsea.jpg's forward (A), each of
#    the 72 heads alone; 0 = B's output unchanged, 1 = A's pooled vector.
patched = patching.patch(lens, x.tensor[1:2], x.tensor[2:3], [(l, h) for l in range(L) for h in range(H)], batch=8)
towards = patched.grid("pooled_towards_a", L, H)  # (L, H)
for flat in np.argsort(-towards, axis=None)[:3]:
    layer, head = divmod(int(flat), H)
    print(f"patching layer {layer + 1} head {head + 1} from chelsea.jpg moves coffee.jpg's output "
          f"{towards[layer, head]:.3f} of the way")
print(f"the 72 heads alone: {towards.sum():.2f} of the way in sum")
# --8<-- [end:patch]

picture = pictures.pictures[0]
fig, ax = plt.subplots(figsize=(5, 4))
for i, source in enumerate(x.sources):
    for kind, marker in (("query", "o"), ("key", "x")):
        chosen = (picture.kind == kind) & (picture.image == i)
        ax.scatter(picture.xy[chosen, 0], picture.xy[chosen, 1], color=f"C{i}", s=8, marker=marker, alpha=0.6,
                   label=source.name if kind == "query" else None)
ax.legend(fontsize=8, markerscale=2)
ax.set_title("layer 12 head 1: queries (o) and keys (x), coloured by photo", fontsize=9)
ax.set_xticks([])
ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "heads_qk.png", dpi=110)

fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
image = axes[0].imshow(moved[8:], cmap="viridis", extent=(0.5, H + 0.5, 12.5, 8.5), aspect="auto")
axes[0].set_title("ablated (mean): 1 - cosine", fontsize=9)
fig.colorbar(image, ax=axes[0], shrink=0.6)
image = axes[1].imshow(towards, cmap="RdBu_r", vmin=-abs(towards).max(), vmax=abs(towards).max(),
                       extent=(0.5, H + 0.5, L + 0.5, 0.5), aspect="auto")
axes[1].set_title("patched chelsea -> coffee: share of the way", fontsize=9)
fig.colorbar(image, ax=axes[1], shrink=0.6)
axes[0].set_yticks(range(9, 13))
axes[1].set_yticks(range(1, 13))
for ax in axes:
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
fig.tight_layout()
fig.savefig(args.out / "heads_effects.png", dpi=110)
print("wrote heads_qk.png and heads_effects.png")
