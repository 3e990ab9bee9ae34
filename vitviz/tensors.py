"""Where the analyses run: on the device the attention is on.

Capture leaves the attention on the model's device. The per-image analyses (rollout, mean
distance, head scores, sinks) take it as it is — a tensor on a GPU or the CPU, or a numpy array,
read without a copy — compute there, and only their results come to the host through
:func:`to_host`. On the CPU nothing moves at all.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch


def as_tensor(array: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A tensor for an analysis to read: numpy arrays are shared, not copied; tensors stay where they are."""
    if isinstance(array, torch.Tensor):
        return array
    with warnings.catch_warnings():
        # Read-only arrays (np.broadcast_to, memory maps) are only read here; every write goes to a copy.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(array)


def to_host(tensor: torch.Tensor) -> np.ndarray:
    """A result as a numpy array on the host: the one way analysis results leave the device."""
    return tensor.detach().cpu().numpy()
