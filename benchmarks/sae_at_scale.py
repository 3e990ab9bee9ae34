"""An SAE on ViT-B/16 layer 11 over ImageNet-1k on a cluster (issue 40): is it the forwards or the trainer that
limits? The two rates measured here in one run on this machine's CPU, and what travels between them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sae_at_scale.py [--images 4] [--repeats 3] [--latents 16384]

- forward: timm's ViT-B/16 at 224 px (random weights: timing does not depend on them), stopped after block 11
  (1-based; what ``features train --layer 11`` runs), batch ``--images``, patch tokens/s (196 per image);
- trainer: :class:`vitviz.features.sae.Trainer` steps (Adam, aux-k, the sparse decoder) on 1,024 tokens of width
  768 (``features train``'s default step), K = ``--latents``, k = 32, tokens/s;
- shards: one batch's tokens written as a float16 shard and read back (:mod:`vitviz.features.shards`), MB/s; and
  the bytes per token each way travels (float32 to the trainer, float16 on disk).

Prints a Markdown table (median of ``--repeats`` after one warm-up each) and the trainer / forward ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _median(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _interleaved(fns, repeats: int) -> list[tuple[float, float]]:
    """(median wall s, median CPU s of this process) of each function, the functions run in turn each repeat (so a
    shared machine's load falls on all of them alike), after one warm-up each."""
    for fn in fns:
        fn()
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t, c = time.perf_counter(), time.process_time()
            fn()
            wall[i].append(time.perf_counter() - t)
            cpu[i].append(time.process_time() - c)
    mid = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return [(mid(w), mid(c)) for w, c in zip(wall, cpu)]


def main() -> None:
    import timm

    from vitviz.features.data import TokenBatch
    from vitviz.features.sae import SAE, Trainer
    from vitviz.features.shards import FORMAT, Shards, write_shard

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latents", type=int, default=16384)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    x = torch.randn(a.images, 3, 224, 224)

    def forward_to_layer_11():
        with torch.inference_mode():
            h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
            for block in model.blocks[:11]:
                h = block(h)
        return h[:, model.num_prefix_tokens:]

    tokens = forward_to_layer_11()  # (B, 196, 768)
    n_forward = tokens.shape[0] * tokens.shape[1]
    batch = torch.randn(1024, 768) * tokens.std() + tokens.mean()
    sae = SAE(768, a.latents, 32).init_from(batch, 0)
    trainer = Trainer(sae)
    (s_forward, c_forward), (s_step, c_step) = _interleaved([forward_to_layer_11, lambda: trainer.step(batch)],
                                                            a.repeats)

    with tempfile.TemporaryDirectory() as tmp:
        shards = Shards(tmp, {"bench": FORMAT}, 1)
        one = TokenBatch(0, [f"{i}.jpg" for i in range(a.images)], tokens, [])
        s_write = _median(lambda: write_shard(Path(tmp), one, "layer 11"), a.repeats)
        s_read = _median(lambda: next(shards.read()), a.repeats)
    mb = tokens.numel() * 2 / 1e6

    fwd, trn = n_forward / s_forward, 1024 / s_step
    fwd_cpu, trn_cpu = n_forward / c_forward, 1024 / c_step
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average "
          f"{os.getloadavg()[0]:.1f} (1-min) at the end; ViT-B/16 random weights, batch {a.images}; "
          f"SAE D 768, K {a.latents}, k 32, 1024 tokens per step\n")
    print("| step | wall s | CPU s | tokens/s (wall) | tokens/s (CPU) | vs the forward (CPU) |\n|---|---|---|---|---|---|")
    print(f"| forward stopped after block 11, {a.images} images ({n_forward} patch tokens) | {s_forward:.3f} | "
          f"{c_forward:.3f} | {fwd:,.0f} | {fwd_cpu:,.0f} | 1.00x |")
    print(f"| one SAE step (Adam, aux-k, sparse decoder), 1024 tokens | {s_step:.3f} | {c_step:.3f} | {trn:,.0f} | "
          f"{trn_cpu:,.0f} | {trn_cpu / fwd_cpu:.2f}x |")
    print(f"| float16 shard write, {mb:.2f} MB | {s_write:.4f} | | {n_forward / s_write:,.0f} | | |")
    print(f"| float16 shard read | {s_read:.4f} | | {n_forward / s_read:,.0f} | | |")
    print(f"\ntrainer / forward tokens/s: {trn / fwd:.2f} (wall), {trn_cpu / fwd_cpu:.2f} (CPU time); bytes per token: "
          f"float32 stream {768 * 4}, float16 shard {768 * 2}")


if __name__ == "__main__":
    main()
