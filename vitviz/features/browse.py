"""What the Features page shows, as arrays: an image set's latent codes (sparse), one image's top latents with their
maps over the patches, one latent's top patches across the set, its activation histogram and frequency."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .sae import SAE
from .top import image_top_latents

MAX_SLOTS = 64  # latents kept per token for SAEs without a top k (ReLU): the largest ones


@dataclass
class Codes:
    """Latent codes of the patch tokens of an image set, k largest per token.

    Attributes:
        values: (n_images, n_patches, k) float32 activations (0 where fewer than k fire).
        index: (n_images, n_patches, k) int32 latent of each slot (0-based).
        grid: (gh, gw) the patch grid; latents: K.
    """

    values: np.ndarray
    index: np.ndarray
    grid: tuple[int, int]
    latents: int

    def image_maps(self, i: int) -> np.ndarray:
        """(K, gh, gw) every latent's map over image ``i``'s patches."""
        dense = np.zeros((self.values.shape[1], self.latents), np.float32)
        np.put_along_axis(dense, self.index[i].astype(np.int64), self.values[i], axis=1)
        return dense.T.reshape(self.latents, *self.grid)

    def latent_maps(self, latent: int) -> np.ndarray:
        """(n_images, gh, gw) latent ``latent``'s map over every image."""
        return np.where(self.index == latent, self.values, 0).sum(-1).reshape(len(self.values), *self.grid)

    def top_latents(self, i: int, n: int = 8, by: str = "max") -> np.ndarray:
        """Image ``i``'s ``n`` latents with the largest max (or sum) over its patches, largest first."""
        return image_top_latents(self.image_maps(i), n, by)

    def strongest_patch(self, i: int, latent: int) -> int:
        """Image ``i``'s patch (0-based raster) where ``latent`` fires most; the lower index on a tie, patch 0 when
        it does not fire there at all."""
        return int(self.latent_maps(latent)[i].reshape(-1).argmax())

    def patch_latents(self, i: int, patch: int) -> list[tuple[int, float]]:
        """(latent, activation) of the latents firing at image ``i``'s ``patch`` (0-based raster), strongest first."""
        pairs = [(int(j), float(v)) for j, v in zip(self.index[i, patch], self.values[i, patch]) if v > 0]
        return sorted(pairs, key=lambda p: -p[1])

    def top_patches(self, latent: int, n: int = 8, per_image: bool = True) -> list[tuple[int, int, float]]:
        """Latent ``latent``'s ``n`` strongest (image, patch, activation) over the set, strongest first; patch 0-based
        raster. ``per_image``: each image's strongest patch only (n images), else the n strongest patches anywhere."""
        maps = self.latent_maps(latent).reshape(len(self.values), -1)
        if per_image:
            best = maps.argmax(1)
            rows = [(i, int(best[i]), float(maps[i, best[i]])) for i in range(len(maps))]
        else:
            patches = maps.shape[1]
            rows = [(int(o // patches), int(o % patches), float(maps.reshape(-1)[o])) for o in range(maps.size)]
        rows = sorted((r for r in rows if r[2] > 0), key=lambda r: -r[2])
        return rows[:n]

    def activations(self, latent: int) -> np.ndarray:
        """The latent's non-zero activations over every patch of the set (1-D)."""
        a = self.latent_maps(latent).reshape(-1)
        return a[a > 0]

    def frequency(self, latent: int) -> float:
        """Share of the set's patch tokens on which the latent fires (> 0)."""
        return float((self.latent_maps(latent) > 0).mean())


@torch.no_grad()
def encode_images(lens, sae: SAE, images: list, point: str, batch_size: int = 8) -> Codes:
    """Encode the patch tokens of ``images`` (model-input PIL images or paths) at ``point`` (the adapters' name).

    Returns:
        Codes with k = the SAE's top k (or :data:`MAX_SLOTS` for ReLU SAEs) slots per token.
    """
    slots = sae.topk or min(sae.latents, MAX_SLOTS)
    values, index = [], []
    sae = sae.to(lens.device)
    for s in range(0, len(images), batch_size):
        trace = lens.trace(lens.preprocess(images[s:s + batch_size]), keep=[point], stop_after=point)
        z = sae.encode(trace[point][:, trace.layout.patch_slice].float())
        top = z.topk(slots, dim=-1)
        values.append(top.values.clamp_min(0).cpu().numpy())
        index.append(top.indices.to(torch.int32).cpu().numpy())
    return Codes(np.concatenate(values), np.concatenate(index), tuple(lens.layout.grid_size), sae.latents)
