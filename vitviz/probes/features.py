"""Per-layer features of labelled images: one forward per image keeps every block's output, and each layer's
tokens are read out the way the model reads its last layer.

Pooling (stated in probe.json and on screen):

- ``cls``: the pooled vector as the model pools it, through its final norm (the adapter's ``readout`` applied to
  the layer's tokens: DINOv2's and ViT's CLS token after the final norm, an average-pooling model's mean);
- ``mean``: the mean of the patch tokens after the final norm (prefix tokens left out);
- ``cls+mean``: both, concatenated (DINOv2's linear-evaluation recipe), 2D features.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..adapters import Hooks
from ..errors import ImageError, VitvizError
from ..io.images import LoadedImage, load_image
from .data import LabelError, LabelledImages

POOLINGS = {
    "cls": "the pooled vector as the model pools it, read out from the layer's tokens through the final norm",
    "mean": "the mean of the patch tokens after the final norm (prefix tokens left out)",
    "cls+mean": "the model's pooled vector and the mean of the patch tokens after the final norm, concatenated "
                "(DINOv2's linear evaluation)",
}


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise VitvizError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}.")
    return pooling


def pool(final_norm: torch.Tensor, pooled: torch.Tensor | None, pooling: str, num_prefix_tokens: int) -> torch.Tensor:
    """A probe's input from one layer read out: ``final_norm`` (B, N, D) and the model's ``pooled`` (B, D) ->
    (B, D) for ``cls`` and ``mean``, (B, 2D) for ``cls+mean``."""
    if pooling == "cls":
        return pooled
    mean = final_norm[:, num_prefix_tokens:].mean(dim=1)
    return mean if pooling == "mean" else torch.cat([pooled, mean], dim=-1)


def readout(lens, tokens: torch.Tensor, pooling: str, rules=None) -> torch.Tensor:
    """One layer's tokens (B, N, D) read out as the model reads its last layer's, then pooled: (B, D) or (B, 2D)."""
    keep = ("final_norm",) if pooling == "mean" else ("final_norm", "pooled")
    hooks = Hooks(keep=keep) if rules is None else Hooks(keep=keep, rules=rules)
    lens.adapter.readout(lens.model, tokens, hooks)
    return pool(hooks.kept["final_norm"], hooks.kept.get("pooled"), pooling, lens.layout.num_prefix_tokens)


def batch_features(lens, x: torch.Tensor, pooling: str) -> np.ndarray:
    """Every layer's features of a batch from one forward: x (B, 3, H, W) -> (L, B, F) float64 (layer 0-based)."""
    trace = lens.trace(x, keep="resid_post")
    with torch.inference_mode():
        layers = [readout(lens, trace["resid_post", i], pooling) for i in range(lens.num_layers)]
    return torch.stack(layers).double().cpu().numpy()


def check_scope(lens) -> None:
    """Refuse a window-attention model (Swin): its layers do not share one token sequence."""
    if lens.scope != "global":
        raise VitvizError(f"{lens.label} attends within windows and pools only its last stage: probes read models "
                          "whose every layer has the same tokens (ViT, DeiT, DINOv2, CLIP, ...).")


def layer_features(lens, images: LabelledImages, pooling: str = "cls", batch_size: int = 8,
                   progress=None) -> tuple[np.ndarray, list[str]]:
    """Every layer's features of every image, from one forward per image.

    Args:
        lens: the opened model (:func:`vitviz.open`); a window-attention model (Swin) is refused.
        images: the labelled images (read batch by batch; only their features are held).
        pooling: one of :data:`POOLINGS`.
        progress: called with the number of images done after each batch, or None.

    Returns:
        (features (L, n, F) float64 — layer 0-based, F = D or 2D for ``cls+mean`` —, each image's SHA-256).

    Raises:
        LabelError: an image that cannot be decoded (the sentence names it and where it is listed).
    """
    check_pooling(pooling)
    check_scope(lens)
    out, hashes = [], []
    for start in range(0, len(images.paths), batch_size):
        batch = []
        for i in range(start, min(start + batch_size, len(images.paths))):
            try:
                item = images.paths[i]
                loaded = item if isinstance(item, LoadedImage) else load_image(item, images.names[i])
            except ImageError as exc:
                raise LabelError(f"{images.where[i]}: {exc}") from None
            batch.append(loaded.image)
            hashes.append(loaded.sha256)
        out.append(batch_features(lens, lens.preprocess(batch).tensor, pooling))
        if progress is not None:
            progress(min(start + batch_size, len(images.paths)))
    return np.concatenate(out, axis=1), hashes


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers as stored (state-dict order, each tensor's bytes on the CPU):
    a probe records the backbone it was trained on, and a head is refused on any other."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                      if tensor.numel() else b"")
    return digest.hexdigest()
