"""TextSpan (Gandelsman, Efros & Steinhardt, "Interpreting CLIP's Image Representation via Text-Based Decomposition",
ICLR 2024): each late attention head of CLIP's vision tower described by the texts whose directions span what it
writes.

For one head, C (n, P) is its direct contribution to the image embedding over n images (the head's write into the
pooled vector through the frozen ``post_layernorm``, :func:`vitviz.residual.direct_vectors`, then
``visual_projection``), centred over the images. With U (T, P) the descriptions' unit text embeddings, k times:

    pick   j = argmax_i ‖C ûᵢ‖²            ûᵢ = uᵢ / ‖uᵢ‖ (the variance of the head's writes along text i)
    record ‖C ûⱼ‖² / ‖C₀‖²_F                (the share of the head's variance that text explains)
    remove C ← C − (C ûⱼ) ûⱼᵀ,  U ← U − (U ûⱼ) ûⱼᵀ

so every later pick explains what the earlier ones left. As in the reference code (``replace_with_iterative_removal``)
the texts are projected out of each other; unlike it, the pick reads each remaining direction at unit length (the
variance it explains), not the raw projection's spread, and the texts are not first projected onto the head's top
principal directions unless ``rank`` asks for it.
"""
from __future__ import annotations

from importlib import resources
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ..errors import VitvizError

DESCRIPTIONS_FILE = "descriptions.txt"


def descriptions() -> list[str]:
    """vitviz's own pool of image descriptions (objects, colours, materials, textures, shapes, counts, positions,
    scenes, styles), one per line of ``vitviz/residual/descriptions.txt``; ``#`` lines are section titles."""
    text = resources.files(__package__).joinpath(DESCRIPTIONS_FILE).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def text_span(contributions: np.ndarray, text_directions: np.ndarray, k: int = 5, rank: int | None = None
              ) -> list[tuple[int, float]]:
    """The greedy TextSpan basis of one head.

    Args:
        contributions: (n, P) the head's contributions in the joint space over n images (centred here).
        text_directions: (T, P) the descriptions' embeddings (normalised here).
        k: how many descriptions to pick.
        rank: project the texts onto the contributions' top ``rank`` principal directions first (the reference's
            ``rank``, 80 for OpenCLIP ViT-L); None: use the texts' own directions.

    Returns:
        k pairs (text index, share of the head's total variance it explains); the shares sum to at most 1.
    """
    C = np.asarray(contributions, dtype=np.float64)
    C = C - C.mean(0, keepdims=True)
    U = np.asarray(text_directions, dtype=np.float64)
    U = U / np.linalg.norm(U, axis=1, keepdims=True)
    if rank is not None:
        _, _, vh = np.linalg.svd(C, full_matrices=False)
        vh = vh[:rank]
        U = U @ vh.T @ vh
    total = float((C ** 2).sum())
    picks = []
    tiny = 1e-9 * max(1.0, float(np.abs(U).max()))
    for _ in range(min(k, len(U))):
        norms = np.linalg.norm(U, axis=1)
        alive = norms > tiny  # a text already spanned by the picks has no direction left
        if not alive.any():
            break
        unit = np.where(alive[:, None], U / np.where(alive, norms, 1)[:, None], 0)
        explained = ((C @ unit.T) ** 2).sum(0)
        explained[~alive] = -1
        for j, _ in picks:
            explained[j] = -1
        j = int(np.argmax(explained))
        u = unit[j]
        picks.append((j, float(explained[j]) / total if total > 0 else 0.0))
        C = C - np.outer(C @ u, u)
        U = U - np.outer(U @ u, u)
    return picks


def textspan(lens, images, texts: Sequence[str] | None = None, layers: int | Sequence[int] | None = None, k: int = 5,
             rank: int | None = None, batch_size: int = 16,
             progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """TextSpan for every head of the last layers of a CLIP model's vision tower over an image set.

    Args:
        lens: a whole CLIP model (:func:`vitviz.open` of a ``CLIPModel`` folder or ``hf:openai/clip-vit-base-patch32``).
        images: the image set, as :meth:`vitviz.Lens.preprocess` takes it (paths, PIL images, arrays), a
            :class:`~vitviz.types.ModelInput` or a normalised tensor (n, 3, H, W); at least 2 images.
        texts: the descriptions to choose from; None: vitviz's own pool (:func:`descriptions`).
        layers: the last ``layers`` blocks (an int), or 0-based block indices; None: the last 4 (the paper's), or
            every block of a shallower model.
        k: descriptions per head.
        rank: see :func:`text_span`.
        batch_size: images per forward.
        progress: called with (images done, images) after each batch.

    Returns:
        DataFrame, one row per head and pick: ``layer``, ``head`` (0-based), ``rank`` (1-based pick order), ``text``,
        ``variance_explained`` (the share of that head's variance over the images the text explains, after the
        earlier picks were removed), ``head_variance`` (the head's total variance in the joint space: which heads
        matter at all).

    Raises:
        TextNotAvailable: the model has no text tower.
        VitvizError: fewer than 2 images, or layers out of range.
    """
    from ..explainers import as_tensor
    from .direct import direct_vectors

    tower = lens.text_tower
    texts = list(descriptions() if texts is None else texts)
    if not texts:
        raise VitvizError("TextSpan needs at least one description to choose from.")
    L = lens.num_layers
    if layers is None:
        layers = min(4, L)
    if isinstance(layers, int):
        if not 1 <= layers <= L:
            raise VitvizError(f"TextSpan layers={layers}: give a number of last blocks from 1 to {L}, or 0-based "
                              "block indices.")
        chosen = list(range(L - layers, L))
    else:
        if not layers or any(not -L <= int(l) < L for l in layers):
            raise VitvizError(f"TextSpan layers {list(layers)}: 0-based block indices from 0 to {L - 1} (or a number "
                              "of last blocks).")
        chosen = sorted({int(l) % L for l in layers})
    x = as_tensor(lens, images)
    n = len(x)
    if n < 2:
        raise VitvizError("TextSpan reads the variance of each head's writes over an image set: give at least 2 "
                          "images (the paper uses thousands).")
    W = tower.visual_projection.detach().double().cpu().numpy().T  # (D, P)
    per_head = []
    for start in range(0, n, batch_size):
        heads = direct_vectors(lens, x[start:start + batch_size], point="pooled").heads()  # (b, L, H, D)
        per_head.append(heads[:, chosen] @ W)
        if progress is not None:
            progress(min(start + batch_size, n), n)
    joint = np.concatenate(per_head)  # (n, len(chosen), H, P)
    U = tower.encode(texts).double().cpu().numpy()
    rows = []
    for i, layer in enumerate(chosen):
        for head in range(joint.shape[2]):
            C = joint[:, i, head]
            variance = float(((C - C.mean(0)) ** 2).sum(1).mean())
            for r, (j, share) in enumerate(text_span(C, U, k=k, rank=rank), start=1):
                rows.append((layer, head, r, texts[j], share, variance))
    return pd.DataFrame(rows, columns=["layer", "head", "rank", "text", "variance_explained", "head_variance"])
