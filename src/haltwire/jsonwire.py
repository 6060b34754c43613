"""Reading JSON from the wire: one strict parser for every request body haltwire parses.

Python's ``json`` (and pydantic's parser) read ``NaN``, ``Infinity`` and ``-Infinity``, which
are not JSON (RFC 8259), and read a number too large for a float (``1e400``) as infinity. Such a
value, once parsed, cannot be written back as JSON: encoding the intent that carries it, or the
answer that echoes it, raises (a 500 with a traceback), and forwarding it hands the upstream a
body no JSON parser must accept. ``loads`` refuses all of them as ``NotFinite`` (a
``ValueError``) while the body is parsed, before anything acts on it.

Used by the gateway's edge (every request body, the fast path's and the SDK's), the control
plane's request bodies (``control/routes/wire.py``) and the answers of HTTP upstreams.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

#: What a refusal says; a caller's body is never quoted back.
WHY: Final = "NaN, Infinity and numbers too large for a float (1e400) are not JSON (RFC 8259)"


class NotFinite(ValueError):
    """The text holds a number JSON cannot: NaN, an infinity, or one past a float's range."""

    def __init__(self) -> None:
        super().__init__(WHY)


def _constant(name: str) -> Any:
    raise NotFinite  # NaN, Infinity, -Infinity: the only names json hands here


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400, -1.5e999: past a float's range
        raise NotFinite
    return value


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads`` without what is not JSON: ``NotFinite`` for a non-finite number;
    ``json.JSONDecodeError`` (a ``ValueError``) or ``RecursionError`` as ``json.loads`` raises
    them for everything else it refuses."""
    return json.loads(data, parse_constant=_constant, parse_float=_float)
