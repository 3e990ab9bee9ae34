"""Memory for what a forward keeps at every layer (a trace's (B, L, H, N, N) attention stack)."""
from __future__ import annotations

import torch


def stack_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` for a forward to fill layer by layer.

    Plain ``torch.empty``: mapping it in transparent huge pages (``MADV_HUGEPAGE``) cut its page faults 100x on the
    dev machine but not its CPU time (the kernel still zeroes every byte), so it was left out."""
    return torch.empty(shape, dtype=dtype, device=device)
