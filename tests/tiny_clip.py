"""A tiny random transformers CLIPModel with a tiny CLIP tokenizer, saved to a folder (no download).

The tokenizer is CLIP's own class (byte-level BPE, ``</w>`` word ends, lower-casing) over a vocabulary of the 256
byte symbols, each also as a word end, plus two merges: every text tokenizes, offline.
"""
from __future__ import annotations

from pathlib import Path

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=32,
              patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=48)
PROJECTION_DIM = 16


def tiny_tokenizer():
    """CLIPTokenizer over the byte alphabet: <|startoftext|> = 0, <|endoftext|> = 1 (also padding and unknown)."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    merges = [("o", "g</w>"), ("d", "og</w>")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges)


def tiny_clip(seed: int = 0):
    """(CLIPModel in eval mode, its tokenizer), random weights from ``seed``."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    tokenizer = tiny_tokenizer()
    config = CLIPConfig(text_config=dict(TEXT, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1,
                                         pad_token_id=1),
                        vision_config=VISION, projection_dim=PROJECTION_DIM)
    torch.manual_seed(seed)
    return CLIPModel(config).eval(), tokenizer


def save_tiny_clip(folder: str | Path, seed: int = 0, tokenizer: bool = True, model=None) -> str:
    """Save a tiny CLIP (or ``model``, a CLIPModel built by :func:`tiny_clip`) and its tokenizer to ``folder``."""
    folder = Path(folder)
    built, tok = tiny_clip(seed)
    (model or built).save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return str(folder)


def plant_text_head(model, layer: int, head: int, direction, seed: int = 1) -> None:
    """Make head ``head`` of vision block ``layer`` write along ``direction`` (P,) in the joint space, in place.

    The head's slice of the block's output projection becomes v ⊗ a (a random), so its write at every token is
    (z_h · a) v; v solves visual_projection · (γ ⊙ centred(v)) = direction, so through the frozen post_layernorm
    (centring, then γ) and visual_projection the write at CLS lies along ``direction`` for every image.
    """
    import torch

    vision = model.vision_model
    D = vision.config.hidden_size
    d = D // vision.config.num_attention_heads
    gamma = vision.post_layernorm.weight.detach().double()
    centre = torch.eye(D, dtype=torch.float64) - 1.0 / D
    M = model.visual_projection.weight.detach().double() @ torch.diag(gamma) @ centre  # (P, D)
    v = torch.linalg.pinv(M) @ torch.as_tensor(direction, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, generator=g, dtype=torch.float64)
    out_proj = vision.encoder.layers[layer].self_attn.out_proj
    with torch.no_grad():
        out_proj.weight[:, head * d:(head + 1) * d] = (torch.outer(v, a) * 4 / v.norm()).to(out_proj.weight.dtype)
