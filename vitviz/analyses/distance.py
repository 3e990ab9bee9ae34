"""Mean attention distance (ViT paper Fig. 7 right / Fig. 11; Raghu et al. 2021).

For each head: sum_k a(q, k) * ||p_q - p_k|| in pixels of the model input, with p the patch
centres, averaged over patch queries and then over images. Convention: queries and keys are
patch tokens; attention to prefix tokens (CLS, registers) is dropped and each row renormalised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from ..layout import TokenLayout
from ..tensors import as_tensor, to_host

CONVENTION = ("queries and keys are patch tokens; attention to prefix tokens (CLS, distillation, "
              "registers) is dropped and each query's row renormalised to sum to 1; distances in "
              "pixels of the model input between patch centres")


def patch_distances(layout: TokenLayout) -> np.ndarray:
    """(num_patches, num_patches) Euclidean distances between patch centres, pixels."""
    c = layout.patch_centres()
    return np.sqrt(((c[:, None, :] - c[None, :, :]) ** 2).sum(-1))


def _query_sums(attention: torch.Tensor | np.ndarray, layout: TokenLayout,
                distances: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per patch query, over patch keys: (sum_k a * d, sum_k a), each (B, H, P) float64.

    attention: (B, H, N, N), numpy or a tensor on any device (summed there). Renormalising is then a
    ratio of these sums, so no normalised copy of the attention is made.
    """
    a = as_tensor(attention)[..., layout.patch_slice, layout.patch_slice]
    d = torch.as_tensor(patch_distances(layout)) if distances is None else distances
    # Row-wise dot products as one einsum: ~6x faster than multiply-then-sum on the CPU. The mass: a float64 copy
    # summed is 3x faster than sum(dtype=float64) over the strided patch block (the same sums, bit for bit).
    return torch.einsum("...qk,qk->...q", a, d.to(a)).double(), a.double().sum(-1)


def layer_attention_distance(attention: torch.Tensor | np.ndarray, layout: TokenLayout,
                             distances: torch.Tensor | None = None) -> np.ndarray:
    """Mean attention distance of one layer for each image and head: (B, H, N, N) -> (B, H) pixels."""
    weighted, mass = _query_sums(attention, layout, distances)
    return to_host((weighted / mass).mean(-1))


def mean_attention_distance(attention: np.ndarray | torch.Tensor, layout: TokenLayout) -> np.ndarray:
    """All layers of captured attention: (B, L, H, N, N), numpy or a tensor on any device -> per image (B, L, H) pixels."""
    d = torch.as_tensor(patch_distances(layout))
    return np.stack([layer_attention_distance(attention[:, l], layout, d) for l in range(attention.shape[1])], axis=1)


def mean_attention_distance_conventions(attention: torch.Tensor | np.ndarray,
                                        layout: TokenLayout) -> tuple[np.ndarray, np.ndarray]:
    """Both prefix conventions from one pass: (B, L, H, N, N) -> (renormalised, not renormalised), (B, L, H) pixels each.

    The first is :func:`mean_attention_distance`; the second probing-vits' (prefix keys dropped, rows
    not renormalised, so attention on CLS and registers counts as distance 0).
    """
    d = torch.as_tensor(patch_distances(layout))
    sums = [_query_sums(attention[:, l], layout, d) for l in range(attention.shape[1])]
    return (np.stack([to_host((w / m).mean(-1)) for w, m in sums], axis=1),
            np.stack([to_host(w.mean(-1)) for w, _ in sums], axis=1))


@dataclass
class DistanceResult:
    """Attributes:
        mean: (L, H) mean attention distance over all images, pixels.
        per_image: (B, L, H) the same for each image (the spread).
        convention: how prefix tokens and units are treated.
    """

    mean: np.ndarray
    per_image: np.ndarray
    convention: str = CONVENTION

    @classmethod
    def from_per_image(cls, per_image: list[np.ndarray]) -> "DistanceResult":
        """From B per-image (L, H) results."""
        values = np.stack(per_image)
        return cls(mean=values.mean(axis=0), per_image=values)

    @property
    def spread(self) -> np.ndarray:
        """(L, H) standard deviation over images."""
        return self.per_image.std(axis=0)


@torch.inference_mode()
def stream_mean_attention_distance(model, batches: Iterable[torch.Tensor], layout: TokenLayout,
                                   progress: Callable[[int], None] | None = None) -> DistanceResult:
    """Mean attention distance over many images, one layer's attention in memory at a time.

    Args:
        model: a supported timm ViT.
        batches: iterable of (b, 3, H, W) normalised inputs.
        layout: the token layout for that input size.
        progress: called with the number of images done after each batch.
    """
    from ..lens import Lens
    from ..types import to_model_input

    d = torch.as_tensor(patch_distances(layout))
    per_image, done, lens = [], 0, Lens.around(model)
    for x in batches:
        x = to_model_input(model, x)
        layers = []

        def reduce(probs, point):  # one layer's attention at a time: reduced as the forward reaches it, not kept
            layers.append(layer_attention_distance(probs, layout, d))
            return probs

        lens.trace(x, keep=[], edit={"blocks.*.attn": reduce})
        per_image.append(np.stack(layers, axis=1))
        done += x.shape[0]
        if progress:
            progress(done)
    return DistanceResult.from_per_image(list(np.concatenate(per_image)))


def conv_receptive_field(depth: int, kernel: int = 3) -> np.ndarray:
    """Receptive field width in pixels after 1..depth stacked stride-1 k x k convolutions: 1 + (k-1) l."""
    return 1 + (kernel - 1) * np.arange(1, depth + 1)


def uniform_attention_distance(layout: TokenLayout) -> float:
    """Mean attention distance of a head that attends uniformly to every patch: the grid's reference line.

    116.5 px for a 14x14 grid of 16 px patches; a head above it looks farther than uniform.
    """
    return float(patch_distances(layout).mean())
