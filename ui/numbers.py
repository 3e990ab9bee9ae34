"""Numbers from text the app did not type itself (URL query values, environment variables, a browser event).

Read without ``try: float(...) except ValueError``: the UI catches only :class:`vitviz.errors.VitvizError`, so
a ValueError from inside vitviz (a bug) is never taken for a user's text that is not a number.
"""

from __future__ import annotations

import math
import re

_WHOLE = re.compile(r"\s*[+-]?\d+\s*")
_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*|\s*[+-]?(inf|infinity|nan)\s*", re.IGNORECASE)


def number(value, default=None):
    """``value`` (a number, or text such as ``"0.8"``) as ``float(value)`` reads it; ``default`` where float()
    would refuse it (None, a dict, ``"abc"``)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return float(value)
    return default


def whole(value, default=None):
    """``value`` as ``int(value)`` reads it (an int, a finite float truncated, text of digits such as ``"12"``);
    ``default`` where int() would refuse it (``"1.5"``, ``"abc"``, None, nan, inf)."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else default
    if isinstance(value, str) and _WHOLE.fullmatch(value):
        return int(value)
    return default
