"""Memory for what a forward keeps at every layer (a trace's (B, L, H, N, N) attention stack).

Fresh memory reaches a process one 4 KiB page at a time, each through a page fault in which the kernel zeroes it: a
batch of 64 images of the bundled model keeps 1.2 GB of attention, 300,000 faults, about as much CPU time as every
analysis of that batch (transparent huge pages cut the faults 100x on the dev machine, not the CPU time: the zeroing
remains). So a large stack on the CPU is mapped by this module, and the last mapping is kept: the next stack of the
same size reuses it once no tensor, view or numpy array of the previous one is left (its refcount says so), as a run
of many batches does. At most one mapping is kept; the process holds it until a stack of another size replaces it.
"""
from __future__ import annotations

import math
import mmap
import sys
import threading

import torch

_MIN_BYTES = 2 ** 24  # smaller stacks come from torch's allocator, which reuses freed memory below ~32 MB
_LOCK = threading.Lock()
_SPARE: list[mmap.mmap] = []  # the last stack's mapping


def _refcount(spare: list) -> int | None:
    for memory in spare:
        return sys.getrefcount(memory)
    return None


# References to a kept mapping that no tensor holds: the list's, the loop's and getrefcount's own argument.
_IDLE = _refcount([mmap.mmap(-1, mmap.PAGESIZE)])


def stack_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` for a forward to fill layer by layer; on the CPU, a large one reuses the
    memory of the previous stack of its size when nothing refers to that stack any more."""
    device = torch.device(device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < _MIN_BYTES:
        return torch.empty(shape, dtype=dtype, device=device)
    with _LOCK:
        if _SPARE and len(_SPARE[0]) == nbytes and _refcount(_SPARE) == _IDLE:
            memory = _SPARE[0]
        else:
            memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            _SPARE[:] = [memory]
        # The tensor holds a reference to the mapping until its last view is gone (torch.frombuffer).
        return torch.frombuffer(memory, dtype=dtype).view(shape)
