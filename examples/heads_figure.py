"""A paper figure: every head's attention of one layer, for each image of a folder (rows: images, columns: heads).

    python examples/heads_figure.py assets/ --layer 12 --out heads.png [--model bundled]

The readout's row (CLS, or the mean of the patch rows for models without one) over the patch keys, drawn over the
model-input image; one colour scale per figure (inferno, 0 .. the 99th percentile of all tiles; above it clipped),
with its colour bar. Layers are 1-based here, as on screen.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import vitviz  # noqa: E402
from vitviz.analyses.maps import query_attention_map  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("folder", type=Path)
parser.add_argument("--layer", type=int, default=12, help="1-based")
parser.add_argument("--model", default="bundled")
parser.add_argument("--max-images", type=int, default=4)
parser.add_argument("--out", type=Path, default=Path("heads.png"))
args = parser.parse_args()

lens = vitviz.open(args.model)
files = sorted(p for p in args.folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:args.max_images]
x = lens.preprocess(files)
trace = lens.trace(x, keep=[("attn", args.layer - 1)], stop_after=("attn", args.layer - 1))
attention = trace["attn", args.layer - 1].float().cpu().numpy()  # (B, H, N, N)
query = "cls" if trace.layout.has_class_token else "mean"
maps = np.stack([[query_attention_map(a[None], trace.layout, 0, h, query) for h in range(a.shape[0])]
                 for a in attention])  # (B, H, gh, gw)
top = float(np.percentile(maps, 99))

B, H = maps.shape[:2]
fig, axes = plt.subplots(B, H + 1, figsize=(1.6 * (H + 1), 1.6 * B), squeeze=False)
for i in range(B):
    axes[i, 0].imshow(x.images[i])
    axes[i, 0].set_ylabel(files[i].name, fontsize=7)
    for h in range(H):
        ax = axes[i, h + 1]
        ax.imshow(x.images[i])
        size = x.images[i].size
        shown = ax.imshow(maps[i, h], cmap="inferno", vmin=0, vmax=top, alpha=0.75, interpolation="nearest",
                          extent=(0, size[0], size[1], 0))
        if i == 0:
            ax.set_title(f"head {h + 1}", fontsize=8)
for ax in axes.ravel():
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle(f"{lens.label}: layer {args.layer}, {query.upper() if query == 'cls' else 'mean patch'} query",
             fontsize=8)
bar = fig.colorbar(shown, ax=axes, fraction=0.02, pad=0.01)
bar.set_label(f"attention weight (above {top:.3g} clipped)", fontsize=7)
fig.savefig(args.out, dpi=200)
print(f"wrote {args.out}: {B} images x {H} heads, layer {args.layer}")
