"""The text side of a contrastive image–text model (transformers ``CLIPModel``): its tokenizer, text encoder and the
two projections into the joint space, next to the vision tower every view reads.

CLIP scores an image against a text as ``logit_scale.exp() · cos(e_img, e_txt)`` with
``e_img = visual_projection(pooled)`` (``pooled``: the CLS token after ``post_layernorm``, the adapter's point of
that name) and ``e_txt = text_projection(text pooler_output)``: transformers' ``logits_per_image``.
:class:`TextTower` holds what computes ``e_txt``, ``visual_projection`` and the scale; the vision tower in
:class:`vitviz.Lens` is the same module object as the full model's ``vision_model`` (loaded once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import VitvizError


class TextNotAvailable(VitvizError):
    """Text was asked of a model without a text tower, or of a folder without a tokenizer (the sentence says which)."""


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")

# model_type of a full image–text config -> the transformers class that holds both towers
FULL_MODELS = {"clip": "CLIPModel"}


def is_full_model(config) -> bool:
    """Whether a config is a whole image–text model (vision and text towers), not a vision tower alone."""
    return getattr(config, "model_type", "") in FULL_MODELS and getattr(config, "text_config", None) is not None


@dataclass(frozen=True, eq=False)
class TextTower:
    """A CLIP model's text encoder and projections, for the vision tower opened beside it.

    Attributes:
        model: the transformers ``CLIPModel`` (eval, frozen); its ``vision_model`` is the Lens's model.
        tokenizer: the tokenizer saved with the model, or None (then :meth:`encode` says so).
        source: the folder or hub id it came from.
    """

    model: torch.nn.Module
    tokenizer: object | None
    source: str

    @property
    def visual_projection(self) -> torch.Tensor:
        """(P, D) the matrix taking the pooled vector (D) into the joint space (P): ``e_img = W · pooled``."""
        return self.model.visual_projection.weight

    @property
    def scale(self) -> float:
        """``logit_scale.exp()``: the image–text score is this times the cosine."""
        return float(self.model.logit_scale.detach().double().exp())

    @property
    def projection_dim(self) -> int:
        return int(self.model.visual_projection.weight.shape[0])

    def project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled vectors -> (B, P) image embeddings (not normalised), in ``pooled``'s dtype."""
        return pooled @ self.visual_projection.to(device=pooled.device, dtype=pooled.dtype).T

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """(T, P) unit-norm text embeddings of ``texts`` (transformers' ``get_text_features``, normalised), float32
        (float64 for a float64 model) on the model's device.

        Raises:
            TextNotAvailable: no tokenizer was saved with the model, or no text was given.
        """
        if isinstance(texts, str):
            texts = [texts]
        texts = [str(t) for t in texts]
        if not texts or any(not t.strip() for t in texts):
            raise TextNotAvailable("Give at least one text, none of them empty (e.g. \"a photo of a dog\").")
        if self.tokenizer is None:
            raise TextNotAvailable(f"Model {self.source!r} has a text tower but no tokenizer saved with it "
                                   "(tokenizer.json or vocab.json + merges.txt): save the model's tokenizer into the "
                                   "folder with save_pretrained.")
        param = next(self.model.parameters())
        max_length = int(self.model.config.text_config.max_position_embeddings)
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                tokens = self.tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                                        max_length=max_length, return_tensors="pt")
                features = self.model.get_text_features(input_ids=tokens["input_ids"].to(param.device),
                                                        attention_mask=tokens["attention_mask"].to(param.device))
                features = getattr(features, "pooler_output", features)
                out.append(features.to(torch.promote_types(features.dtype, torch.float32)))
        embeds = torch.cat(out)
        return embeds / embeds.norm(dim=-1, keepdim=True)


def load_tokenizer(source: str, local_only: bool):
    """The tokenizer saved with the model, or None where there is none."""
    from pathlib import Path

    from transformers import AutoTokenizer

    folder = Path(source)
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    except Exception:  # noqa: BLE001 - no tokenizer files: encode() says so when text is asked for
        return None
    # transformers builds a tokenizer of the special tokens alone where no vocabulary was saved
    return tokenizer if len(tokenizer) > 3 else None


def text_tower(full_model: torch.nn.Module, source: str, local_only: bool) -> TextTower:
    """The text tower of a loaded full model (``CLIPModel``)."""
    return TextTower(full_model, load_tokenizer(source, local_only), source)


def why_no_text(text: TextTower | None, label: str, model: torch.nn.Module | None = None) -> str | None:
    """One sentence saying why a model has no text to read, or None."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    if text is None and model_type.startswith("siglip"):
        return (f"{label}: vitviz does not read SigLIP's text tower yet (only CLIP's), so it cannot score images "
                "against texts; the vision tower's maps, heads and probes all apply.")
    if text is None:
        return (f"{label} has no text tower: open a whole CLIP model (a folder saved from transformers' CLIPModel, "
                "or hf:openai/clip-vit-base-patch32) rather than its vision tower alone.")
    return None


__all__ = ["FULL_MODELS", "TextNotAvailable", "TextTower", "is_full_model", "load_tokenizer", "text_tower",
           "why_no_text"]
