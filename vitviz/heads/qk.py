"""One head's queries and keys in one picture (AttentionViz, Yeh et al., IEEE VIS 2023).

A head attends from query i to key j with softmax_j(q_i · k_j · scale + bias_ij). Embedding the queries and
keys of many tokens together shows the whole head at once: a query lies near the keys it attends to. Two
corrections make distance in the joint space track the dot product, both exact on the softmax, in this order
(AttentionViz's notebook, catherinesyeh/attention-exploration):

1. **translate** the keys by t = mean(q) - mean(k) over the tokens shown: q_i · (k_j + t) = q_i · k_j + q_i · t
   adds one constant per query to its logits, so every attention row is unchanged;
2. **scale** keys by c and queries by 1/c with c = sqrt(mean‖q‖ / mean‖k‖), the key norms taken after the
   translation: (q/c) · (c k) = q · k, so the dot products are unchanged and the two clouds have the same mean
   norm.

How well the picture keeps attention is the Pearson correlation between query-key distance ‖q_i - k_j‖ in
the joint (d-dimensional) space and their dot product q_i · k_j over every pair of the same image (the same
window for window attention): AttentionViz's target is close to -1.

A bias added to the scores (a relative position bias, Swin's shift mask) is not in the picture: the points
are q and k only. :func:`score_scale_and_bias` finds it (what is left of the scores once the scaled dot
product is taken out) so a page can say how much of the scores it carries.

Arrays are float64 numpy; tokens are 0-based sequence indices, prefix tokens first, then patches in raster
order (:class:`vitviz.layout.TokenLayout`). Shapes: G groups (images, or images x windows), N tokens per
group, d head dimensions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import VitvizError
from ..layout import TokenLayout
from .corrections import (Corrected, ScoreParts, attention_rows, correct, distance_dot_correlation,
                          norm_balance, score_scale_and_bias, translate_keys)

PROJECTIONS = ("pca", "tsne", "umap")
PROJECTION_TEXT = {
    "pca": "PCA (first two principal components, signs fixed: the largest loading of each is positive)",
    "tsne": "t-SNE (scikit-learn, cosine metric, perplexity 20 or (points - 1) / 3 if fewer, PCA initialisation)",
    "umap": "UMAP (umap-learn, cosine metric, 10 neighbours, min_dist 0.1)",
}
COLOURINGS = ("kind", "position", "image")


@dataclass(frozen=True)
class HeadQK:
    """One head's queries and keys as its dot product sees them.

    Attributes:
        queries, keys: (G, N, d) float64.
        image: (G,) the 0-based image of each group (global attention: G = B and image = arange(B); window
            attention: G = B * nW, each image's windows in the forward's order).
        layer, head: 0-based.
        windows: windows per image (1 for global attention).
    """

    queries: np.ndarray
    keys: np.ndarray
    image: np.ndarray
    layer: int
    head: int
    windows: int = 1


def head_qk(trace, layer: int, head: int) -> HeadQK:
    """The queries and keys of one head from a :class:`vitviz.Trace` that kept ``("q", layer)`` and ``("k", layer)``.

    Args:
        trace: from ``lens.trace(x, keep=[("q", layer), ("k", layer)], stop_after=("k", layer))``: q and k
            (B, H, N, d), or window attention's (B, nW, H, T, d).
        layer, head: 0-based.

    Returns:
        HeadQK with queries and keys (G, N, d) float64 (G = B, or B * nW windows of N = T slots).
    """
    q, k = trace["q", layer], trace["k", layer]
    heads = q.shape[-3]
    if not 0 <= head < heads:
        raise VitvizError(f"head index {head} is out of range: layer {layer % trace.num_layers + 1} has {heads} heads "
                          f"(indices 0 to {heads - 1}; on screen and on the command line heads 1 to {heads}).")
    q = q[..., head, :, :].detach().cpu().double().numpy()
    k = k[..., head, :, :].detach().cpu().double().numpy()
    B = q.shape[0]
    windows = 1 if q.ndim == 3 else q.shape[1]
    d = q.shape[-1]
    return HeadQK(q.reshape(B * windows, -1, d), k.reshape(B * windows, -1, d), np.repeat(np.arange(B), windows),
                  layer % trace.num_layers, head, windows)


# --- the picture ---------------------------------------------------------------------------------


def project(points: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """2-D coordinates of points (M, d) -> (M, 2) float64.

    Args:
        method: ``"pca"``, ``"tsne"`` or ``"umap"`` (:data:`PROJECTION_TEXT` says each one's settings).
        seed: the random state of t-SNE and UMAP (the same seed, the same picture).

    Raises:
        VitvizError: an unknown method, or UMAP without umap-learn installed.
    """
    points = np.asarray(points, dtype=np.float64)
    if method == "pca":
        centred = points - points.mean(axis=0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        axes = vt[:2]
        # scikit-learn changed its sign rule between versions: fix it here (largest loading positive).
        signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])
        axes = axes * np.where(signs == 0, 1.0, signs)[:, None]
        out = centred @ axes.T
        return out if out.shape[1] == 2 else np.pad(out, ((0, 0), (0, 2 - out.shape[1])))
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = min(20.0, max((len(points) - 1) / 3.0, 1.0))
        return TSNE(n_components=2, metric="cosine", perplexity=perplexity, init="pca", random_state=seed,
                    n_jobs=1).fit_transform(points).astype(np.float64)
    if method == "umap":
        try:
            import umap
        except ImportError as exc:
            raise VitvizError("UMAP needs the package umap-learn (pip install umap-learn); PCA and t-SNE work "
                              "without it.") from exc
        return umap.UMAP(n_components=2, n_neighbors=min(10, len(points) - 1), min_dist=0.1, metric="cosine",
                         random_state=seed, n_jobs=1).fit_transform(points).astype(np.float64)
    raise VitvizError(f"unknown projection {method!r}: choose one of {', '.join(PROJECTIONS)}.")


@dataclass(frozen=True)
class HeadPicture:
    """One head's queries and keys in 2-D, with how well the joint space keeps the dot product.

    Attributes:
        xy: (2 * G * N, 2) coordinates: every group's queries first, then every group's keys (the order of
            :attr:`kind`, :attr:`image`, :attr:`token`).
        kind: (2 * G * N,) ``"query"`` or ``"key"``.
        image: (2 * G * N,) 0-based image of each point.
        token: (2 * G * N,) 0-based index in the sequence (prefix tokens first) or window slot.
        correlation_before, correlation_after: :func:`distance_dot_correlation` of the raw and the corrected
            queries and keys.
        translation_norm: ‖mean(q) - mean(k)‖; scale: c.
        layer, head: 0-based; projection: the method's key.
    """

    xy: np.ndarray
    kind: np.ndarray
    image: np.ndarray
    token: np.ndarray
    correlation_before: float
    correlation_after: float
    translation_norm: float
    scale: float
    layer: int
    head: int
    projection: str


def head_picture(qk: HeadQK, projection: str = "pca", seed: int = 0) -> HeadPicture:
    """The corrected queries and keys of one head projected together to 2-D (:func:`correct`, :func:`project`)."""
    G, N, d = qk.queries.shape
    fixed = correct(qk.queries, qk.keys)
    xy = project(np.concatenate([fixed.queries.reshape(-1, d), fixed.keys.reshape(-1, d)]), projection, seed)
    image = np.repeat(qk.image, N)
    token = np.tile(np.arange(N), G)
    return HeadPicture(
        xy=xy, kind=np.repeat(np.array(["query", "key"]), G * N), image=np.concatenate([image, image]),
        token=np.concatenate([token, token]),
        correlation_before=distance_dot_correlation(qk.queries, qk.keys),
        correlation_after=distance_dot_correlation(fixed.queries, fixed.keys),
        translation_norm=float(np.linalg.norm(fixed.translation)), scale=fixed.scale, layer=qk.layer, head=qk.head,
        projection=projection)


def token_positions(layout: TokenLayout) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every token of the sequence, 0-based on the patch grid; -1 for prefix tokens: (N,) x2."""
    gh, gw = layout.grid_size
    npt = layout.num_prefix_tokens
    rows = np.concatenate([np.full(npt, -1), np.repeat(np.arange(gh), gw)])
    cols = np.concatenate([np.full(npt, -1), np.tile(np.arange(gw), gh)])
    return rows, cols


def position_colours(layout: TokenLayout) -> np.ndarray:
    """A 2-D colour wheel over the patch grid: (N, 3) uint8 RGB per token, prefix tokens mid grey.

    Hue is the angle of the patch's centre around the grid's centre, saturation its distance from the centre
    (white-ish in the middle, full colour at the rim), so neighbouring patches get neighbouring colours and
    every row and column is told apart: a positional head shows as a rainbow.
    """
    import colorsys

    gh, gw = layout.grid_size
    rows, cols = token_positions(layout)
    out = np.full((layout.num_tokens, 3), 128, dtype=np.uint8)
    cy, cx = (gh - 1) / 2, (gw - 1) / 2
    reach = max(np.hypot(max(cy, 0.5), max(cx, 0.5)), 1e-9)
    for i in range(layout.num_prefix_tokens, layout.num_tokens):
        dy, dx = (rows[i] - cy) / max(cy, 0.5), (cols[i] - cx) / max(cx, 0.5)
        hue = (np.arctan2(dy, dx) / (2 * np.pi)) % 1.0
        saturation = min(np.hypot(rows[i] - cy, cols[i] - cx) / reach, 1.0) * 0.85 + 0.15
        out[i] = np.round(np.array(colorsys.hsv_to_rgb(hue, saturation, 0.92)) * 255).astype(np.uint8)
    return out


# --- a layer over an image set (the CLI and the page) -----------------------------------------------

POINT_COLUMNS = {
    "image": "the image's name (the file as given, or relative to the folder given)",
    "token": "0-based index in the sequence (prefix tokens first, then patches in raster order)",
    "token_name": "cls, dist, reg0.. (prefix tokens) or patch",
    "kind": "query or key",
    "layer": "1-based layer",
    "head": "1-based head",
    "x": "the projection's first coordinate (no unit)",
    "y": "the projection's second coordinate",
    "row": "0-based patch row on the grid (empty for prefix tokens)",
    "column": "0-based patch column on the grid (empty for prefix tokens)",
}


@dataclass(frozen=True)
class LayerPictures:
    """Every asked head of one layer over an image set.

    Attributes:
        pictures: one :class:`HeadPicture` per head, in the order asked.
        bias_share: per head, :attr:`ScoreParts.bias_share` (a bias added to the scores is not in the picture).
        score_scale: per head, the scale of q · k in the scores.
    """

    pictures: list[HeadPicture]
    bias_share: list[float]
    score_scale: list[float]

    def correlations(self) -> list[dict]:
        """One row per head: layer and head 1-based, correlation before and after, the corrections, the bias."""
        return [{"layer": p.layer + 1, "head": p.head + 1, "correlation_before": p.correlation_before,
                 "correlation_after": p.correlation_after, "translation_norm": p.translation_norm,
                 "scale_c": p.scale, "score_scale": s, "score_bias_share": b, "bias_not_in_picture": b > 1e-4}
                for p, b, s in zip(self.pictures, self.bias_share, self.score_scale)]


def layer_pictures(lens, x, layer: int, heads: list[int] | None = None, projection: str = "pca", seed: int = 0,
                   progress=None) -> LayerPictures:
    """Queries and keys of the given heads of one layer over the images ``x``, projected to 2-D.

    Args:
        lens: a :class:`vitviz.Lens` of a model whose tokens attend globally.
        x: the images (ModelInput, tensor or what :meth:`vitviz.Lens.preprocess` takes).
        layer: 0-based; heads: 0-based (default every head).
        progress: called with (done, total heads) after each head.

    Raises:
        VitvizError: a window-attention model (its queries and keys live in windows, not on one image).
    """
    work = QKWork(layer, None if heads is None else tuple(heads))
    arrays = work.arrays(lens, x)
    return pictures_of(arrays, work.layer % lens.num_layers, projection, seed, progress)


@dataclass(frozen=True)
class QKArrays:
    """One layer's queries, keys and scores of some heads over a batch of images (what a picture is made of).

    Attributes:
        queries, keys: (B, h, N, d) float64; scores: (B, h, N, N) float64 (the logits the softmax sees).
        heads: the h heads, 0-based. layout: the batch's token layout.
    """

    queries: np.ndarray
    keys: np.ndarray
    scores: np.ndarray
    heads: tuple[int, ...]
    layout: TokenLayout

    @staticmethod
    def join(parts: list["QKArrays"]) -> "QKArrays":
        """Batches of the same heads, one after the other, as one image set."""
        first = parts[0]
        return QKArrays(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("queries", "keys", "scores")),
                        first.heads, first.layout)


@dataclass(frozen=True)
class QKWork:
    """The per-batch function of ``python -m vitviz qk`` (:mod:`vitviz.runs.engines`: here or on Ray actors): a
    batch's :class:`QKArrays`, the forward stopped after the layer's scores.

    Attributes:
        layer: 0-based. heads: 0-based (None: every head of the layer).
    """

    layer: int
    heads: tuple[int, ...] | None = None

    def __call__(self, lens, batch) -> QKArrays:
        return self.arrays(lens, batch.x)

    def arrays(self, lens, x) -> QKArrays:
        """:class:`QKArrays` of the images ``x`` (what :meth:`vitviz.Lens.preprocess` takes)."""
        if lens.scope != "global":
            raise VitvizError(f"{lens.label} attends within windows: its queries and keys meet only inside one "
                              "window, so there is no one picture of a head over an image; the queries and keys view "
                              "reads models whose tokens attend to every token.")
        layer = self.layer
        trace = lens.trace(x, keep=[("q", layer), ("k", layer), ("scores", layer)], stop_after=("scores", layer))
        layer = layer % lens.num_layers
        count = trace["q", layer].shape[1]
        heads = tuple(range(count)) if self.heads is None else tuple(self.heads)
        for head in heads:
            if not 0 <= head < count:
                raise VitvizError(f"head index {head} is out of range: layer {layer + 1} has {count} heads (indices 0 "
                                  f"to {count - 1}; on screen and on the command line heads 1 to {count}).")
        pick = list(heads)
        q, k, scores = (trace[name, layer][:, pick].detach().cpu().double().numpy() for name in ("q", "k", "scores"))
        return QKArrays(q, k, scores, heads, trace.layout)


def pictures_of(arrays: QKArrays, layer: int, projection: str = "pca", seed: int = 0, progress=None) -> LayerPictures:
    """Each head of ``arrays`` (0-based ``layer``) in 2-D, over every image of it; ``progress(done, total heads)``."""
    pictures, shares, scales = [], [], []
    B = len(arrays.queries)
    for done, head in enumerate(arrays.heads, 1):
        i = done - 1
        qk = HeadQK(arrays.queries[:, i], arrays.keys[:, i], np.arange(B), layer, head)
        parts = score_scale_and_bias(qk.queries, qk.keys, arrays.scores[:, i])
        pictures.append(head_picture(qk, projection, seed))
        shares.append(parts.bias_share)
        scales.append(parts.scale)
        if progress:
            progress(done, len(arrays.heads))
    return LayerPictures(pictures, shares, scales)


def points_table(pictures: LayerPictures, layout: TokenLayout, names: list[str]):
    """Every point of every head as a table (:data:`POINT_COLUMNS`): pandas DataFrame, queries then keys."""
    import pandas as pd

    rows, cols = token_positions(layout)
    frames = []
    for p in pictures.pictures:
        npt = layout.num_prefix_tokens
        frames.append(pd.DataFrame({
            "image": np.asarray(names, dtype=object)[p.image], "token": p.token.astype(np.int32),
            "token_name": [layout.prefix_tokens[t] if t < npt else "patch" for t in p.token], "kind": p.kind,
            "layer": np.int32(p.layer + 1), "head": np.int32(p.head + 1), "x": p.xy[:, 0], "y": p.xy[:, 1],
            "row": pd.array(np.where(rows[p.token] < 0, None, rows[p.token]), dtype="Int32"),
            "column": pd.array(np.where(cols[p.token] < 0, None, cols[p.token]), dtype="Int32")}))
    return pd.concat(frames, ignore_index=True)
