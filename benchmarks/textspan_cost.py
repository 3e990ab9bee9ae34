"""TextSpan over an image set against the model's plain forward over the same images, on a small random CLIP.

A random transformers CLIPModel (vision: 12 blocks, 192 wide, 3 heads, 224 px at patch 16 — ViT-Ti's shape; text:
4 blocks, 128 wide; joint space 128), saved with a tiny tokenizer (tests/tiny_clip.py's) and opened with vitviz.open.
Times, fastest of ``--repeats`` interleaved runs:
  forward    transformers' own ``get_image_features`` over the n images (SDPA, batch 16): the plain forward
  textspan   ``vitviz.textspan(lens, images, layers=4, k=5)`` over the same images, vitviz's pool of ~190 texts
  text       ``lens.encode_text`` of that pool alone (inside textspan's time)
and the ratio textspan / forward in the same run, with the peak memory each adds (VmHWM).
Usage:
    .venv/bin/python benchmarks/textspan_cost.py [--images 100] [--repeats 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import vitviz  # noqa: E402
from _memory import peak_extra_mib  # noqa: E402
from tiny_clip import tiny_tokenizer  # noqa: E402
from vitviz.residual.textspan import descriptions  # noqa: E402


def build(folder: Path) -> str:
    from transformers import CLIPConfig, CLIPModel

    tokenizer = tiny_tokenizer()
    config = CLIPConfig(
        text_config=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=2,
                         max_position_embeddings=77, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=192, intermediate_size=768, num_hidden_layers=12, num_attention_heads=3,
                           image_size=224, patch_size=16),
        projection_dim=128)
    torch.manual_seed(0)
    CLIPModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from transformers import CLIPModel

    with tempfile.TemporaryDirectory() as tmp:
        folder = build(Path(tmp))
        lens = vitviz.open(folder)
        plain = CLIPModel.from_pretrained(folder).eval()
        torch.manual_seed(1)
        x = torch.randn(args.images, 3, 224, 224)
        pool = descriptions()

        def forward():
            with torch.inference_mode():
                for s in range(0, len(x), 16):
                    plain.get_image_features(pixel_values=x[s:s + 16])

        def textspan():
            return vitviz.textspan(lens, x, layers=4, k=5)

        def text():
            lens.encode_text(pool)

        times = {"forward": [], "textspan": [], "text": []}
        for _ in range(args.repeats):
            for name, fn in (("forward", forward), ("textspan", textspan), ("text", text)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        best = {k: min(v) for k, v in times.items()}
        memory = {"forward": peak_extra_mib(forward), "textspan": peak_extra_mib(textspan)}
        table = textspan()
    print(f"{args.images} images 224 px, ViT-Ti-shaped random CLIP, {len(pool)} descriptions, torch threads "
          f"{torch.get_num_threads()}, fastest of {args.repeats}")
    for name in ("forward", "textspan", "text"):
        print(f"  {name:9s} {best[name]:8.2f} s")
    print(f"  textspan / forward: {best['textspan'] / best['forward']:.1f}x")
    print(f"  peak memory added: forward {memory['forward']:.0f} MiB, textspan {memory['textspan']:.0f} MiB")
    print(f"  table rows: {len(table)} (4 blocks x 3 heads x 5 picks)")


if __name__ == "__main__":
    main()
