"""Whether the Hugging Face hub (or torchvision's download server) can be reached: the one network probe
(offline mode answers at once)."""
from __future__ import annotations

import socket
import threading
import time

_HUB = ("huggingface.co", 443)
_PROBE_TTL = 30.0
_probe: dict[tuple[str, int], tuple[float, bool]] = {}  # host -> (when, answer)
_probe_lock = threading.Lock()


def _hub_reachable(timeout: float = 1.0) -> bool:
    """Whether the Hugging Face hub answers, decided within ``timeout`` seconds (see :func:`host_reachable`)."""
    return host_reachable(_HUB, timeout)


def host_reachable(host: tuple[str, int], timeout: float = 1.0) -> bool:
    """Whether ``host`` (name, port) answers, decided within ``timeout`` seconds.

    ``HF_HUB_OFFLINE`` (vitviz's one offline switch) answers at once. The probe runs in a daemon thread because
    ``socket.create_connection``'s timeout does not bound the DNS lookup, which can hang for
    many seconds on a machine without a network. The answer is reused for 30 s.
    """
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    with _probe_lock:
        seen = _probe.get(host)
        if seen is not None and time.monotonic() - seen[0] < _PROBE_TTL:
            return seen[1]
        answer = {"reachable": False}

        def connect():
            try:
                socket.create_connection(host, timeout=timeout).close()
                answer["reachable"] = True
            except OSError:
                pass

        probe = threading.Thread(target=connect, daemon=True, name="vitviz-hub-probe")
        probe.start()
        probe.join(timeout)
        _probe[host] = (time.monotonic(), answer["reachable"])
        return answer["reachable"]
