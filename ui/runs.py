"""At most ``VITVIZ_MAX_RUNS`` model runs at once in one server process.

Every run holds its activations and its attention until it ends: on a shared server, sessions
arriving together would otherwise pile them up. A session over the limit waits for a slot (and is
told so) instead. Plain threading, no Streamlit here: the app passes a callback that shows the wait.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class RunLimiter:
    """A process-wide counting semaphore that says how many runs are ahead of a waiting one.

    Re-entrant per thread: a run that starts another (faithfulness asking for gradient rollout)
    uses the slot it already holds, so a limit of 1 cannot deadlock.

    Args:
        limit: the most runs at once; None: no limit.
    """

    def __init__(self, limit: int | None):
        self.limit = limit
        self._cond = threading.Condition()
        self._held = threading.local()
        self.running = 0
        self.waiting = 0

    @contextmanager
    def slot(self, on_wait: Callable[[int], None] | None = None) -> Iterator[None]:
        """Hold one run slot for the ``with`` block; ``on_wait(n)`` is called first if ``n`` runs are ahead."""
        if self.limit is None or getattr(self._held, "inside", False):
            yield
            return
        with self._cond:
            ahead = self.running + self.waiting if self.running >= self.limit else 0
            self.waiting += 1
        try:
            if ahead and on_wait is not None:
                on_wait(ahead)
            with self._cond:
                self._cond.wait_for(lambda: self.running < self.limit)
                self.running += 1
        finally:
            with self._cond:
                self.waiting -= 1
        self._held.inside = True
        try:
            yield
        finally:
            self._held.inside = False
            with self._cond:
                self.running -= 1
                self._cond.notify()
