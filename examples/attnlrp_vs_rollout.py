"""Which map to trust on your images: AttnLRP against rollout and the random floor, by deletion and insertion.

    python examples/attnlrp_vs_rollout.py assets/ [--model bundled] [--steps 11]

Prints each method's mean deletion (MoRF) and insertion AUC over the images, and whether it can be told apart from
chance (the spread of 10 seeded random maps), as `python -m vitviz faithfulness` computes them.
"""
import argparse
from pathlib import Path

import vitviz

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("folder", type=Path)
parser.add_argument("--model", default="bundled")
parser.add_argument("--steps", type=int, default=11)
parser.add_argument("--max-images", type=int, default=4)
args = parser.parse_args()

lens = vitviz.open(args.model)
files = sorted(p for p in args.folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:args.max_images]
tables = vitviz.faithfulness(lens, lens.preprocess(files), methods=["attnlrp", "rollout", "random"],
                             protocols=("morf", "insertion"), names=[p.name for p in files], steps=args.steps)
aucs = tables.aucs
seeds = aucs[aucs.method.str.startswith("random_seed_")]
band = seeds.groupby(["protocol", "method"]).auc.mean().groupby("protocol").agg(["min", "max"])
means = aucs[aucs.method.isin(["attnlrp", "rollout", "random"])].groupby(["method", "protocol"]).auc.mean().unstack()
print(f"{len(files)} images, {lens.label}")
print(f"{'method':10} {'deletion AUC':>13} {'insertion AUC':>14}  (deletion: lower is better; insertion: higher)")
for method, row in means.iterrows():
    verdict = []
    if method != "random":
        if row["morf"] < band.loc["morf", "min"]:
            verdict.append("deletion beats every random seed")
        if row["insertion"] > band.loc["insertion", "max"]:
            verdict.append("insertion beats every random seed")
    print(f"{method:10} {row['morf']:13.3f} {row['insertion']:14.3f}  {'; '.join(verdict) or 'within chance'}")
