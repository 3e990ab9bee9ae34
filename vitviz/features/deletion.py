"""Concept deletion: zero the latents that drive a target, one more at a time, and watch the target — against the
same number of random latents, with the faithfulness page's statistics.

Per image: the latents are ranked by their feature-attribution score (activation × gradient of the target through
the splice, summed over the patches; :func:`vitviz.features.splice.feature_attribution`); step m zeroes the top m at
every patch with the splice running (error term kept, so step 0 is the plain forward and step m removes exactly
those latents' share Σ_j z_j W_dec[j] / s of the tokens). The random floor zeroes m latents drawn from those active
on the image (seeds ``seed + 0 .. random_seeds - 1``). The score of a curve is its mean drop, mean over m = 1..steps of
s(0) − s(m), in the target's units. Over images the paired difference top − random (mean over seeds) gets the
percentile bootstrap interval of :mod:`vitviz.perturbation.stats`; an interval containing 0 reads "cannot be told
from chance".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..perturbation.stats import Interval, bootstrap_mean
from .sae import SAE
from .splice import Splice, feature_attribution


@dataclass
class Deletion:
    """Attributes:
        curves: rows (image, order, step, value): order ``"top"`` or ``"random_seed_<s>"``, step m = latents zeroed.
        drops: rows (image, order, mean_drop).
        difference: top − random (mean over seeds) mean drop over images, with its 95 % bootstrap interval.
        sentence: the difference in one sentence ("cannot be told from chance" when the interval holds 0).
        settings: what decides the numbers.
        target_text: the target in words.
    """

    curves: pd.DataFrame
    drops: pd.DataFrame
    difference: Interval
    sentence: str
    settings: dict
    target_text: str = ""


def concept_deletion(lens, x, sae: SAE, target=None, steps: int = 8, random_seeds: int = 5, seed: int = 0,
                     names: list[str] | None = None, num_prefix_tokens: int | None = None) -> Deletion:
    """Concept deletion curves of a batch (see the module docstring).

    Args:
        x: a ModelInput or a normalised tensor (B, 3, H, W).
        target: default the top-1 logit (headless: the pooled vector's projection), bound on the unperturbed images.
        steps: latents zeroed at the last step.
    """
    tensor = x.tensor if hasattr(x, "tensor") else x
    fa = feature_attribution(lens, tensor, sae, target, num_prefix_tokens=num_prefix_tokens)
    names = names or [f"image{i}" for i in range(len(tensor))]
    B, K = len(tensor), sae.latents
    bound = fa.target
    orders = {"top": [np.argsort(-fa.scores[i], kind="stable")[:steps] for i in range(B)]}
    for s in range(random_seeds):
        orders[f"random_seed_{seed + s}"] = [
            np.random.default_rng([seed + s, i]).permutation(np.flatnonzero(fa.activations[i].max(0) > 0))[:steps]
            for i in range(B)]

    def score(ablate: torch.Tensor) -> np.ndarray:  # one forward of the batch, a row of latents zeroed per image
        splice = Splice(sae, ablate=ablate, num_prefix_tokens=num_prefix_tokens)
        return bound(dict(lens.trace(tensor, keep=[bound.point], edit=splice.edit))).double().cpu().numpy()

    rows = []
    with torch.inference_mode():
        base = score(torch.zeros(B, K, dtype=torch.bool))
        for order, latents in orders.items():
            rows += [(names[i], order, 0, float(base[i])) for i in range(B)]
            for m in range(1, steps + 1):
                todo = [i for i in range(B) if len(latents[i]) >= m]
                if not todo:
                    break
                mask = torch.zeros(B, K, dtype=torch.bool)
                for i in todo:
                    mask[i, torch.as_tensor(latents[i][:m], dtype=torch.long)] = True
                values = score(mask)
                rows += [(names[i], order, m, float(values[i])) for i in todo]
    curves = pd.DataFrame(rows, columns=["image", "order", "step", "value"])
    first = curves[curves.step == 0].set_index(["image", "order"])["value"]
    later = curves[curves.step > 0].join(first.rename("base"), on=["image", "order"])
    drops = (later.base - later.value).groupby([later.image, later.order]).mean().rename("mean_drop").reset_index()
    wide = drops.pivot(index="image", columns="order", values="mean_drop")
    randoms = [c for c in wide.columns if c.startswith("random_seed_")]
    diff = bootstrap_mean((wide["top"] - wide[randoms].mean(axis=1)).to_numpy())
    spread = (f"{diff.mean:+.3g}, 95 % interval {diff.low:+.3g} to {diff.high:+.3g}, {diff.n} image"
              f"{'s' if diff.n != 1 else ''}")
    if not diff.excludes_zero:
        text = f"Deleting the top latents cannot be told from deleting random ones (difference in mean drop {spread})."
    else:
        text = (f"Deleting the top latents lowers {fa.target.text()} {'more' if diff.mean > 0 else 'less'} than "
                f"deleting as many random active latents (difference in mean drop {spread}).")
    settings = {"steps": steps, "random_seeds": random_seeds, "first_seed": seed, "target": fa.target.describe(),
                "ranking": "feature attribution: sum over patches of z * d target / d z through the splice",
                "score": "mean over m = 1..steps of s(0) - s(m), target units",
                "interval": "percentile bootstrap over images of top - mean over seeds of random, 10000 resamples"}
    return Deletion(curves, drops, diff, text, settings, fa.target.text())
