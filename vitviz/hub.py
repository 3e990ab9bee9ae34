"""Whether the Hugging Face hub can be reached: the one network probe (offline mode answers at once)."""
from __future__ import annotations

import socket
import threading
import time

_HUB = ("huggingface.co", 443)
_PROBE_TTL = 30.0
_probe: dict[str, float | bool] = {}
_probe_lock = threading.Lock()


def _hub_reachable(timeout: float = 1.0) -> bool:
    """Whether the Hugging Face hub answers, decided within ``timeout`` seconds.

    ``HF_HUB_OFFLINE`` answers at once. The probe runs in a daemon thread because
    ``socket.create_connection``'s timeout does not bound the DNS lookup, which can hang for
    many seconds on a machine without a network. The answer is reused for 30 s.
    """
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    with _probe_lock:
        if time.monotonic() - _probe.get("at", -_PROBE_TTL) < _PROBE_TTL:
            return bool(_probe["reachable"])
        answer = {"reachable": False}

        def connect():
            try:
                socket.create_connection(_HUB, timeout=timeout).close()
                answer["reachable"] = True
            except OSError:
                pass

        probe = threading.Thread(target=connect, daemon=True, name="vitviz-hub-probe")
        probe.start()
        probe.join(timeout)
        _probe.update(at=time.monotonic(), reachable=answer["reachable"])
        return answer["reachable"]
