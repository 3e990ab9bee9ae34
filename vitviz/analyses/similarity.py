"""Representation similarity: centred kernel alignment (CKA) between layers, on features of the same images.

- :func:`linear_cka`: Kornblith et al. (ICML 2019), ``‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)`` on centred features, all
  examples at once.
- :func:`gram` and :func:`unbiased_hsic`: the unbiased HSIC of Song et al. (JMLR 2012) on any kernel's Gram matrices.
- :class:`MinibatchCKA`: the minibatch estimator of Nguyen, Raghu & Kornblith (ICLR 2021): per minibatch the unbiased
  HSIC of every pair of layers, summed over minibatches, CKA = Σ HSIC(K, L) / sqrt(Σ HSIC(K, K) · Σ HSIC(L, L)). Its
  memory is that of one minibatch's Gram matrices plus the sums, whatever the number of images; a Bayesian bootstrap
  over the images (:func:`weighted_hsic`) gives the interval.

Examples are images: every function takes features (n, F) whose row i is image i, or Gram matrices (n, n).
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import OptionError

KERNELS = ("linear", "rbf")


def linear_cka(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> float:
    """Linear CKA of two sets of features of the same n examples (Kornblith et al. 2019, eq. 5), in float64.

    Args:
        x: (n, F1) features.
        y: (n, F2) features of the same examples in the same order.

    Returns:
        CKA in [0, 1]; 1 when y is an orthogonal transform of x times a scalar (after centring).
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    cross = torch.linalg.matrix_norm(y.T @ x) ** 2
    return float(cross / (torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)))


def gram(x: torch.Tensor, kernel: str = "linear", threshold: float = 1.0) -> torch.Tensor:
    """Gram matrices of the examples in float64.

    Args:
        x: (n, F) features of n examples, or (L, n, F): L layers of the same width at once.
        kernel: ``"linear"`` (x xᵀ) or ``"rbf"``: exp(-‖xᵢ - xⱼ‖² / (2 σ²)) with σ² = threshold² times the median
            squared distance of the n examples (Kornblith et al.'s reference code, whose ``threshold`` this is).
        threshold: the RBF width as a fraction of the median distance.

    Returns:
        (n, n) or (L, n, n) float64, of the features centred over the n examples: the unbiased HSIC does not change
        when every example's features move by one vector, and without centring a large common mean (a ViT's residual
        stream has one) would cancel most of float64's digits.
    """
    x = x.to(torch.float64)
    x = x - x.mean(-2, keepdim=True)
    dots = x @ x.transpose(-1, -2)
    if kernel == "linear":
        return dots
    if kernel != "rbf":
        raise OptionError(f"kernel {kernel!r} is not one of {KERNELS}")
    norms = torch.diagonal(dots, dim1=-2, dim2=-1)
    squared = (norms[..., :, None] + norms[..., None, :] - 2 * dots).clamp_min(0)
    median = squared.flatten(-2).median(-1).values[..., None, None]
    return torch.exp(-squared / (2 * threshold ** 2 * median))


def unbiased_hsic(k: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """The unbiased HSIC of Song et al. (2012, eq. 5) between every Gram matrix of ``k`` and every one of ``l``.

    With K̃, L̃ the Gram matrices with zeroed diagonals and 1 the ones vector,
    HSIC₁ = [tr(K̃L̃) + 1ᵀK̃1 · 1ᵀL̃1 / ((n-1)(n-2)) - 2/(n-2) · 1ᵀK̃L̃1] / (n(n-3)).

    Args:
        k: (A, n, n) symmetric Gram matrices, n >= 4.
        l: (B, n, n) symmetric Gram matrices of the same n examples.

    Returns:
        (A, B) float64.
    """
    n = k.shape[-1]
    if n < 4:
        raise OptionError(f"the unbiased HSIC needs 4 or more examples, not {n}")
    k = k.to(torch.float64) * (1 - torch.eye(n, dtype=torch.float64, device=k.device))
    l = l.to(torch.float64) * (1 - torch.eye(n, dtype=torch.float64, device=l.device))
    k_rows, l_rows = k.sum(-1), l.sum(-1)  # (A, n), (B, n): K̃1, L̃1
    trace = torch.einsum("aij,bij->ab", k, l)  # tr(K̃L̃), both symmetric
    totals = k_rows.sum(-1)[:, None] * l_rows.sum(-1)[None, :] / ((n - 1) * (n - 2))
    cross = 2 / (n - 2) * (k_rows @ l_rows.T)
    return (trace + totals - cross) / (n * (n - 3))


def weighted_hsic(k: torch.Tensor, l: torch.Tensor, w: torch.Tensor, same: bool = False) -> torch.Tensor:
    """The unbiased HSIC with every example weighted, for a Bayesian bootstrap over examples (Rubin 1981).

    Song et al.'s estimator is HSIC₁ = E[k_ij l_ij] + E[k_ij l_qr] - 2 E[k_ij l_iq], each mean over distinct indices.
    Here each of the three means is weighted by the product of its examples' weights (w_i w_j, w_i w_j w_q w_r,
    w_i w_j w_q): with every weight 1 it is :func:`unbiased_hsic`; with 0/1 weights, :func:`unbiased_hsic` of the
    chosen examples. The sums over distinct indices come from the unrestricted ones by inclusion-exclusion, and their
    normalisers from the power sums S_k = Σ w^k.

    Args:
        k: (A, n, n) symmetric Gram matrices.
        l: (B, n, n) symmetric Gram matrices of the same n examples.
        w: (R, n) non-negative weights, at least four of them positive in each row.
        same: ``l`` is ``k`` and only the matching pairs (a, a) are wanted.

    Returns:
        (R, A, B) float64; (R, A) when ``same``.
    """
    n = k.shape[-1]
    off = 1 - torch.eye(n, dtype=torch.float64, device=k.device)
    k = k.to(torch.float64) * off
    l = k if same else l.to(torch.float64) * off
    w = w.to(device=k.device, dtype=torch.float64)
    w2 = w * w
    # every pair's elementwise product k_ij l_ij, summed under three weightings of (i, j)
    products = (k * k).flatten(1) if same else (k[:, None] * l[None]).flatten(2)  # (A, n²) or (A, B, n²)
    weightings = torch.stack([w[:, :, None] * w[:, None, :], w[:, :, None] * w2[:, None, :],
                              w2[:, :, None] * w2[:, None, :]]).flatten(2)  # (3, R, n²)
    p11, p12, p22 = torch.einsum("xp,vrp->vrx", products.flatten(0, -2), weightings).unflatten(
        -1, products.shape[:-1])  # 3 x (R, A[, B])
    kw = torch.einsum("aij,rj->rai", k, w)  # K̃w
    lw = kw if same else torch.einsum("bij,rj->rbi", l, w)
    if same:
        centre1 = torch.einsum("ri,rai,rai->ra", w, kw, kw)
        centre2 = torch.einsum("ri,rai,rai->ra", w2, kw, kw)
        totals = torch.einsum("ri,rai->ra", w, kw) ** 2
    else:
        centre1 = torch.einsum("ri,rai,rbi->rab", w, kw, lw)
        centre2 = torch.einsum("ri,rai,rbi->rab", w2, kw, lw)
        totals = torch.einsum("ri,rai->ra", w, kw)[:, :, None] * torch.einsum("ri,rbi->rb", w, lw)[:, None, :]
    triples = centre1 - p12  # Σ over distinct (i, j, q) of w_i w_j w_q k_ij l_iq
    shared = centre2 - p22  # Σ over distinct (i, j, r) of w_i² w_j w_r k_ij l_ir
    quads = totals - 4 * shared - 2 * p22  # Σ over distinct (i, j, q, r) of w_i w_j w_q w_r k_ij l_qr
    s1, s2, s3, s4 = ((w ** p).sum(-1) for p in (1, 2, 3, 4))
    n2 = s1 ** 2 - s2
    n3 = s1 ** 3 - 3 * s1 * s2 + 2 * s3
    n4 = s1 ** 4 - 6 * s1 ** 2 * s2 + 3 * s2 ** 2 + 8 * s1 * s3 - 6 * s4
    shape = (-1,) + (1,) * (p11.dim() - 1)
    return p11 / n2.view(shape) + quads / n4.view(shape) - 2 * triples / n3.view(shape)


def self_hsic(k: torch.Tensor) -> torch.Tensor:
    """``unbiased_hsic(k, k)``'s diagonal without its off-diagonal pairs: (A, n, n) -> (A,)."""
    n = k.shape[-1]
    k = k.to(torch.float64) * (1 - torch.eye(n, dtype=torch.float64, device=k.device))
    rows = k.sum(-1)
    return ((k * k).sum((-1, -2)) + rows.sum(-1) ** 2 / ((n - 1) * (n - 2))
            - 2 / (n - 2) * (rows * rows).sum(-1)) / (n * (n - 3))


def minibatch_sums(grams_a: torch.Tensor, grams_b: torch.Tensor, same: bool = False, replicates: int = 200,
                   seed: int = 0, index: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One minibatch's terms of :class:`MinibatchCKA`'s sums: the unbiased HSIC of every pair of layers, then the same
    under each bootstrap replicate's image weights.

    The weights of minibatch ``index`` come from a generator seeded by (``seed``, ``index``) alone, so a minibatch
    computed in another process, or in a run resumed after a kill, adds exactly the terms it adds in one run.

    Args:
        grams_a: (L_a, n, n) Gram matrices of one side's layers, n >= 4 images.
        grams_b: (L_b, n, n) of the other side's, the same images (``grams_a`` itself when ``same``).
        same: the two sides are one model's layers: the self-HSIC is computed once.
        replicates: bootstrap replicates R.
        seed: of the bootstrap.
        index: the minibatch's 0-based position in the image set.

    Returns:
        ab (1 + R, L_a, L_b), aa (1 + R, L_a), bb (1 + R, L_b) float64: row 0 the plain terms, then the replicates'.
    """
    n = grams_a.shape[-1]
    ab = np.zeros((1 + replicates, grams_a.shape[0], grams_b.shape[0]))
    aa, bb = np.zeros(ab.shape[:2]), np.zeros((1 + replicates, grams_b.shape[0]))
    ab[0] = unbiased_hsic(grams_a, grams_b).cpu().numpy()
    aa[0] = self_hsic(grams_a).cpu().numpy()
    bb[0] = aa[0] if same else self_hsic(grams_b).cpu().numpy()
    if replicates:
        state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0]
        generator = torch.Generator().manual_seed(int(state) & (2 ** 63 - 1))
        weights = -torch.log(torch.rand(replicates, n, generator=generator, dtype=torch.float64))
        step = max(1, MinibatchCKA.CHUNK // (3 * n * n))
        for start in range(0, replicates, step):
            w = weights[start:start + step]
            mass = w.mean(-1).numpy()  # the minibatch counts with its images' weight, as it counts with n
            rows = slice(1 + start, 1 + start + len(w))
            ab[rows] = mass[:, None, None] * weighted_hsic(grams_a, grams_b, w).cpu().numpy()
            aa[rows] = mass[:, None] * weighted_hsic(grams_a, grams_a, w, same=True).cpu().numpy()
            bb[rows] = aa[rows] if same else mass[:, None] * weighted_hsic(grams_b, grams_b, w, same=True).cpu().numpy()
    return ab, aa, bb


class MinibatchCKA:
    """CKA of every layer of one model against every layer of another, accumulated minibatch by minibatch.

    Nguyen, Raghu & Kornblith (ICLR 2021, eq. 3): the unbiased HSIC of each minibatch's Gram matrices is summed over
    minibatches, so the memory is one minibatch's Gram matrices and (L_a, L_b) sums, independent of the number of
    images. The interval is a Bayesian bootstrap over images (Rubin 1981): each replicate gives every image an Exp(1)
    weight, each minibatch's HSIC becomes :func:`weighted_hsic` and counts with its images' mean weight, and the 2.5
    and 97.5 percentiles of the replicates' CKA bound it. The replicates' sums are (R, L_a, L_b): still independent
    of the number of images. Minibatch i's weights depend on (seed, i) only (:func:`minibatch_sums`).

    Args:
        num_a: layers of one side (L_a).
        num_b: layers of the other (L_b).
        replicates: bootstrap replicates R (0: no interval).
        seed: of the bootstrap's weights.
    """

    CHUNK = 1 << 22  # weights x examples² per step of the bootstrap: bounds its scratch memory (~100 MB float64)

    def __init__(self, num_a: int, num_b: int, replicates: int = 200, seed: int = 0):
        self.replicates, self.seed = replicates, seed
        self.ab = np.zeros((1 + replicates, num_a, num_b))  # row 0: the estimate; then the replicates
        self.aa = np.zeros((1 + replicates, num_a))
        self.bb = np.zeros((1 + replicates, num_b))
        self.batches = 0
        self.images = 0

    def update(self, grams_a: torch.Tensor, grams_b: torch.Tensor, same: bool = False) -> None:
        """Add one minibatch, the next in order: (L_a, n, n) and (L_b, n, n) Gram matrices of the same n >= 4 images.

        ``same``: the two sides are one model's layers (``grams_b`` is ``grams_a``): its self-HSIC is computed once.
        """
        sums = minibatch_sums(grams_a, grams_b, same, self.replicates, self.seed, self.batches)
        self.add(*sums, images=grams_a.shape[-1])

    def add(self, ab: np.ndarray, aa: np.ndarray, bb: np.ndarray, images: int) -> None:
        """Add one minibatch's terms computed elsewhere (:func:`minibatch_sums`, in a worker or a stored part)."""
        self.ab += ab
        self.aa += aa
        self.bb += bb
        self.batches += 1
        self.images += images

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cka, low, high), each (L_a, L_b) float64; low and high NaN without replicates."""
        # An unbiased self-HSIC can fall to or below 0 on a few images: the CKA of that layer is then undefined.
        defined = (self.aa[:, :, None] > 0) & (self.bb[:, None, :] > 0)
        denominator = np.sqrt(np.abs(self.aa[:, :, None] * self.bb[:, None, :]))
        values = np.divide(self.ab, denominator, where=defined, out=np.full_like(denominator, np.nan))
        cka = values[0]
        if self.replicates == 0:
            return cka, np.full_like(cka, np.nan), np.full_like(cka, np.nan)
        low, high = np.nanpercentile(values[1:], [2.5, 97.5], axis=0)
        return cka, low, high
