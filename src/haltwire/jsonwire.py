"""Reading JSON from the wire: one strict parser for every request body haltwire parses.

Python's ``json`` reads things that are not JSON, or that nothing can write back as JSON:
``NaN``, ``Infinity`` and ``-Infinity`` (not JSON, RFC 8259), a number too large for a float
(``1e400``, read as infinity), and an unpaired UTF-16 surrogate escape (``"\\ud800"``, read as
a string no UTF-8 encoder takes; RFC 7493). Once parsed, such a value breaks whatever writes it
next: encoding the intent that carries it, or the answer that echoes it, raises (a 500 with a
traceback), and forwarding it hands the upstream a body no JSON parser must accept. ``loads``
refuses all of them as ``NotJson`` (a ``ValueError``) while the body is parsed, before anything
acts on it.

Used by the gateway's edge (every request body, the fast path's and the SDK's), the control
plane's request bodies (``control/routes/wire.py``) and the answers of HTTP upstreams.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

#: What a refusal says; a caller's body is never quoted back.
NOT_FINITE: Final = "NaN, Infinity and numbers too large for a float (1e400) are not JSON (RFC 8259)"
SURROGATE: Final = "an unpaired UTF-16 surrogate (\\ud800 to \\udfff) is not text (RFC 8259, RFC 7493)"

#: Where a surrogate can come from: a \uD800-\uDFFF escape, or one encoded raw (in text; in
#: bytes as CESU-8, which ``json.loads`` decodes with ``surrogatepass``). Only a body holding
#: one is checked.
_SURROGATE_HINT: Final = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_SURROGATE_HINT_BYTES: Final = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


class NotJson(ValueError):
    """The text parses in Python but is not JSON that can be written back: a non-finite number
    or an unpaired surrogate. The message says which, never quoting the text."""


def _constant(name: str) -> Any:
    raise NotJson(NOT_FINITE)  # NaN, Infinity, -Infinity: the only names json hands here


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400, -1.5e999: past a float's range
        raise NotJson(NOT_FINITE)
    return value


def loads(data: str | bytes | bytearray) -> Any:
    """``json.loads`` without what is not JSON: ``NotJson`` for a non-finite number or an
    unpaired surrogate; ``json.JSONDecodeError`` (a ``ValueError``) or ``RecursionError`` as
    ``json.loads`` raises them for everything else it refuses."""
    value = json.loads(data, parse_constant=_constant, parse_float=_float)
    hint = _SURROGATE_HINT.search(data) if isinstance(data, str) else _SURROGATE_HINT_BYTES.search(data)
    if hint is not None:  # rare: an escaped character outside the BMP, or a surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise NotJson(SURROGATE) from None
    return value
