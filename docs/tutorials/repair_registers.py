"""Tutorial: find what distorts the maps (high-norm outliers, attention sinks) and repair it inside the forward.

    .venv/bin/python docs/tutorials/repair_registers.py --out docs/tutorials/img

Prints what it measures and writes two figures into --out: registers_sinks.png (chelsea.jpg's rollout before and
after sink masking, on the bundled model) and registers_planted.png (a tiny stand-in model's last-layer token norms
before and after the test-time register). tests/test_docs.py runs it and compares its printed lines with
docs/tutorials/repair_registers.txt, which the tutorial page shows.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402

import vitviz  # noqa: E402
from vitviz.analyses import registers as R  # noqa: E402
from vitviz.analyses.tokens import attention_sinks  # noqa: E402
from vitviz.layout import TokenLayout  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", type=Path, default=Path("."))
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

# --8<-- [start:outliers]
# 1. Outliers: patch tokens whose norm leaving a block is above 10x the image's median patch norm (Darcet et al.).
lens = vitviz.open("bundled")
x = lens.preprocess([f"assets/{n}.jpg" for n in ("astronaut", "chelsea", "coffee", "rocket")])
layout = lens.layout_for(x)
norms = R.token_norms(lens.model, x.tensor).cpu().numpy()  # (B, L, N)
outliers = R.find_outliers(norms, layout)
print(f"{lens.label}")
print(f"largest patch norm / median, any block and photo: {outliers.ratio.max():.2f} (outlier above "
      f"{outliers.factor:g}); outliers: {outliers.any}")
# --8<-- [end:outliers]

# --8<-- [start:sinks]
# 2. Attention sinks: patches that receive far more attention than a typical patch, layer by layer; sink masking
#    drops each layer's sinks as keys inside the forward (rows renormalised) and runs the model on.
attention = lens.trace(x, keep=("attn",)).stack("attn")  # (B, L, H, N, N)
sinks = [attention_sinks(a, layout) for a in attention]
for source, s in zip(x.sources, sinks):
    found = [f"layer {layer + 1}: patches {s.patch_sinks(layout, [layer]).tolist()}" for layer in range(len(s.sinks))
             if len(s.patch_sinks(layout, [layer]))]
    print(f"{source.name:13s} sinks in {'; '.join(found) or 'no layer'}")
repair = R.Repair("sinks")
chelsea = R.repair_maps(lens.model, x.tensor[1:2], layout, repair.edit(lens.model, layout, sinks=sinks[1:2]))
print(f"chelsea.jpg with its sinks masked: pooled cosine to the plain forward {chelsea.change.pooled_cosine[0]:.4f}")
# --8<-- [end:sinks]

# --8<-- [start:planted]
# 3. The test-time register (Jiang et al. 2025) needs outliers, and the bundled model has none: a stand-in, a tiny
#    random ViT (4 blocks, 4x4 patches) into which one MLP neuron is written that fires on three patches and makes
#    them outliers from block 2 on.
torch.manual_seed(0)
tiny = timm.create_model("vit_small_patch16_224", pretrained=False, depth=4, embed_dim=64, num_heads=4, img_size=64,
                         num_classes=10).eval()
with torch.no_grad():  # timm's init leaves the heads near zero: random weights of a typical size instead
    for parameter in tiny.parameters():
        parameter.add_(torch.randn_like(parameter) * 0.05)
tiny_layout = TokenLayout.from_model(tiny)
images = torch.randn(6, 3, 64, 64)
typical = float(R.token_norms(tiny, images)[:, 0, tiny_layout.patch_slice].median())
u, v = torch.randn(64), torch.randn(64)
u, v = (u - u.mean()) / (u - u.mean()).norm(), (v - v.mean()) / (v - v.mean()).norm()
with torch.no_grad():
    for p in (3, 6, 9):  # a component along u in these patches' position embeddings ...
        tiny.pos_embed[0, tiny_layout.pos_embed_prefix_rows + p] += 3 * typical * u
    block = tiny.blocks[1]  # ... that hidden unit 7 of block 2 reads, and writes 30 typical norms along v
    block.mlp.fc1.weight[7] = 4 * u / block.norm2.weight
    block.mlp.fc1.bias[7] = -14 - 4 * (block.norm2.bias @ u)
    block.mlp.fc2.weight[:, 7] = 30 * typical / 14 * 3 * v

search = R.search_register_neurons(tiny, [images], tiny_layout)
print(f"stand-in: outliers from block {search.outliers.emergence_layer + 1} on; register neurons, best first: "
      + ", ".join(f"block {n.layer + 1} unit {n.index}" for n in search.neurons[:3]))
register = R.TestTimeRegister(((search.neurons[0].layer, search.neurons[0].index),))
after = R.find_outliers(R.token_norms(tiny, images, edit=register.edit(tiny_layout)).numpy(),
                        register.layout(tiny_layout))
change = R.compare_outputs(tiny, images, register.edit(tiny_layout))
print(f"with the register: outlier patches in the last block {int(after.mask[:, -1].sum())} (before "
      f"{int(search.outliers.mask[:, -1].sum())}); pooled cosine {change.pooled_cosine.min():.3f} at the least")
# --8<-- [end:planted]

fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
image = x.images[1]
extent = (0, image.size[0], image.size[1], 0)
axes[0].imshow(image)
axes[0].set_title("chelsea.jpg", fontsize=9)
for ax, values, title in ((axes[1], chelsea.rollout_before, "rollout"),
                          (axes[2], chelsea.rollout_after, "rollout, sinks masked in the forward")):
    ax.imshow(image)
    ax.imshow(values, cmap="inferno", alpha=0.7, extent=extent, interpolation="nearest")
    ax.set_title(title, fontsize=9)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(args.out / "registers_sinks.png", dpi=110)

before = search.outliers.norms[0, -1, tiny_layout.patch_slice].reshape(tiny_layout.grid_size)
repaired = after.norms[0, -1]
fig, axes = plt.subplots(1, 2, figsize=(6.5, 3.2))
top = float(max(before.max(), repaired.max()))
for ax, values, title in ((axes[0], before, "stand-in, last block: patch norms"),
                          (axes[1], repaired[after.layout.patch_slice].reshape(tiny_layout.grid_size),
                           f"with the register (its norm {repaired[1]:.0f})")):
    shown = ax.imshow(values, cmap="viridis", vmin=0, vmax=top)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.colorbar(shown, ax=axes, shrink=0.8)
fig.savefig(args.out / "registers_planted.png", dpi=110, bbox_inches="tight")
print("wrote registers_sinks.png and registers_planted.png")
