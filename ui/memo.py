"""One byte-bounded, least-recently-used cache for models, images and analyses, shared by every session.

Streamlit's caches bound entries by count; one ViT-L/16 @384 result is ~0.5 GiB, so a count says
nothing about memory. Here every entry is weighed (:func:`nbytes`) and the least recently used
entries are dropped until the total fits ``VITVIZ_CACHE_MB``. The newest entry always stays, even
when it alone is over the budget (the resolution guard keeps one image's attention under half).

One computation per key at a time: a second session asking for the same key waits for the first
instead of running the model again.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

import numpy as np
import pandas as pd
import torch
from PIL import Image

from vitviz.trace import Trace


def nbytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Memory an object holds in arrays, tensors, images and models (shared parts counted once)."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes) if obj.base is None or id(obj.base) not in seen else 0
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.numel()
    if isinstance(obj, torch.nn.Module):
        return sum(nbytes(t, seen) for t in [*obj.parameters(), *obj.buffers()])
    if isinstance(obj, Image.Image):
        return obj.width * obj.height * len(obj.getbands()) * (4 if obj.mode in ("I", "F") else 1)
    if isinstance(obj, Trace):  # a stack and its layer slices share memory: counted once
        return obj.nbytes + nbytes(obj.inputs, seen)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(nbytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(nbytes(k, seen) + nbytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(nbytes(v, seen) for v in obj)
    if isinstance(obj, pd.DataFrame):
        return int(obj.memory_usage(deep=True).sum())
    if isinstance(obj, (bytes, bytearray, str)):
        return sys.getsizeof(obj)
    return 64


class ByteLRU:
    """A thread-safe mapping that evicts its least recently used entries beyond ``budget`` bytes.

    Args:
        budget: the most bytes the entries may hold together (see :func:`nbytes`).
    """

    def __init__(self, budget: int):
        self.budget = int(budget)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Lock] = {}
        self.evictions = 0

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value of ``key``, computing and storing it on a miss. Exceptions are not cached."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][0]
            key_lock = self._computing.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._entries:  # computed by another thread while this one waited
                    self._entries.move_to_end(key)
                    return self._entries[key][0]
            try:
                value = compute()
                # Stored before the key's lock is forgotten: a caller arriving in between would find neither the
                # value nor the lock and compute it again.
                self.put(key, value)
            finally:
                with self._lock:
                    self._computing.pop(key, None)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        size = nbytes(value)
        with self._lock:
            self._entries[key] = (value, size)
            self._entries.move_to_end(key)
            self._evict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            return self._entries[key][0]

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def _evict(self) -> None:
        total = sum(size for _, size in self._entries.values())
        while total > self.budget and len(self._entries) > 1:
            _, (_, size) = self._entries.popitem(last=False)
            total -= size
            self.evictions += 1

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)

    @property
    def used(self) -> int:
        with self._lock:
            return sum(size for _, size in self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
