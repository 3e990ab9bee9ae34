"""SAEs on the bundled model (issue 31): training throughput against the plain forward, peak memory against the
number of images, and explained variance / L0 / dead fraction against K and k.

    .venv/bin/python benchmarks/features_sae.py            # all three
    .venv/bin/python benchmarks/features_sae.py --quality  # only the K x k table
    .venv/bin/python benchmarks/features_sae.py --speed    # only throughput and memory

Images: the four photos in assets/ (astronaut, chelsea, coffee, rocket), repeated to make larger sets for the
throughput and memory rows (timing does not depend on the pixels). Layer 9 (1-based) resid_post, patch tokens only
(256 per image at 224 px). The quality table trains on three photos' tokens (768) and also evaluates on the fourth
(rocket.jpg, 256 tokens, never seen): with four images this is what an SAE learns from one small folder, not a
published figure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks._memory import cli_in_fresh_process  # noqa: E402

ASSETS = sorted((ROOT / "assets").glob("*.jpg"))
LAYER, POINT = 9, "blocks.8.resid_post"


def _median(times):
    return sorted(times)[len(times) // 2]


def throughput(images: int = 16, batch: int = 8, repeats: int = 3) -> None:
    import vitviz
    from vitviz.features import SAE
    from vitviz.features.train import TrainSettings, train
    from vitviz.io.inputs import ImageFile

    lens = vitviz.open("bundled", device="cpu")
    paths = [ASSETS[i % len(ASSETS)] for i in range(images)]
    x = lens.preprocess(paths[:batch])
    tokens_per_batch = batch * lens.layout.num_patches
    plain, truncated = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        lens.trace(x, keep=("pooled",))
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        tok = lens.trace(x, keep=[POINT], stop_after=POINT)[POINT][:, 1:].reshape(-1, 384)
        truncated.append(time.perf_counter() - t)
    sae = SAE(384, 4096, 32).init_from(tok, 0)
    from vitviz.features.sae import Trainer

    import vitviz.features.trainer as sae_module

    sparse = sae_module._sparse_decode

    def dense(index, values, W_dec):  # the dense (b, K) @ (K, D) product the sparse decoder replaces
        return torch.zeros(len(index), W_dec.shape[0]).scatter(-1, index, values) @ W_dec

    trainer = Trainer(sae)
    steps, dense_steps = [], []
    for _ in range(repeats):  # interleaved: the machine's load moves both alike
        for decoder, times in ((sparse, steps), (dense, dense_steps)):
            sae_module._sparse_decode = decoder
            t = time.perf_counter()
            for s in range(0, len(tok), 1024):
                trainer.step(tok[s:s + 1024])
            times.append(time.perf_counter() - t)
    sae_module._sparse_decode = sparse
    files = [ImageFile(p, f"{i}_{p.name}") for i, p in enumerate(paths)]
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        train(lens, files, TrainSettings(point="resid_post", layer=LAYER, latents=4096, topk=32, epochs=1,
                                               batch_size=batch),
              Path(out), progress=False)
        whole = time.perf_counter() - t
    rate = lambda sec, n=tokens_per_batch: n / sec  # noqa: E731
    print(f"\nThroughput, bundled ViT-S/14 @224, batch {batch} images = {tokens_per_batch} patch tokens, "
          f"K = 4096, k = 32, 1024 tokens per step, CPU threads {torch.get_num_threads()}")
    print("| step | s per batch | patch tokens/s | vs plain forward |")
    print("|---|---|---|---|")
    base = _median(plain)
    for name, sec in [("plain forward (whole model, fused)", base), ("forward stopped after layer 9", _median(truncated)),
                      ("SAE steps alone (Adam, aux-k), sparse decoder", _median(steps)),
                      ("SAE steps alone, dense decoder (reference)", _median(dense_steps))]:
        print(f"| {name} | {sec:.3f} | {rate(sec):.0f} | {sec / base:.2f}x |")
    per_batch = whole / (images / batch)
    print(f"| features train end to end ({images} images: decode, forward, steps, checkpoint) | {per_batch:.3f} | "
          f"{rate(per_batch):.0f} | {per_batch / base:.2f}x |")


def memory(sizes=(8, 32)) -> None:
    print("\nPeak RSS of `features train` in a fresh process (K = 4096, k = 32, batch 8 images)")
    print("| images | wall s | peak RSS MiB |")
    print("|---|---|---|")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(n):  # copies: the same file named twice is read once
                (Path(tmp) / f"{i}.jpg").write_bytes(ASSETS[i % len(ASSETS)].read_bytes())
            wall, hwm, _ = cli_in_fresh_process(["features", "train", tmp, "--layer", str(LAYER), "--latents", "4096",
                                                 "--topk", "32", "--epochs", "1", "--device", "cpu",
                                                 "--out", str(Path(tmp) / "out")])
        print(f"| {n} | {wall:.1f} | {hwm / 1024:.0f} |")


def quality(latents=(256, 1024, 4096), topks=(8, 32), epochs: int = 50) -> None:
    import vitviz
    from vitviz.features import SAE, evaluate

    lens = vitviz.open("bundled", device="cpu")
    tokens = lens.trace(lens.preprocess(ASSETS), keep=[POINT], stop_after=POINT)[POINT][:, 1:].float()
    held = [i for i, p in enumerate(ASSETS) if p.name == "rocket.jpg"][0]
    train_tok = torch.cat([tokens[i] for i in range(len(ASSETS)) if i != held])
    test_tok = tokens[held]
    print(f"\nQuality, bundled ViT-S/14 layer {LAYER} resid_post: trained on {len(train_tok)} patch tokens "
          f"(astronaut, chelsea, coffee), {epochs} epochs, batch 256, seed 0; held out rocket.jpg ({len(test_tok)})")
    print("| K | k | EV train | EV held out | L0 | dead (train tokens) | s |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for K in latents:
        for k in topks:
            t = time.perf_counter()
            sae = SAE.fit(train_tok, latents=K, topk=k, seed=0, epochs=epochs, batch_size=256)
            sec = time.perf_counter() - t
            a, b = evaluate(sae, train_tok), evaluate(sae, test_tok)
            rows.append({"K": K, "k": k, "ev_train": a["explained_variance"], "ev_held": b["explained_variance"],
                         "l0": a["l0"], "dead": a["dead_fraction"]})
            print(f"| {K} | {k} | {a['explained_variance']:.3f} | {b['explained_variance']:.3f} | {a['l0']:.1f} | "
                  f"{a['dead_fraction']:.1%} | {sec:.1f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quality", action="store_true", help="only the K x k table")
    parser.add_argument("--speed", action="store_true", help="only throughput and memory")
    args = parser.parse_args()
    if not args.quality:
        throughput()
        memory()
    if not args.speed:
        quality()
