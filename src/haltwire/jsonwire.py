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

Every tool call parses two bodies and writes two, so both directions take orjson (C) when it is
installed, and Python's ``json`` for whatever orjson would read or write differently:

- ``loads``: orjson refuses every value above by itself (each unpaired surrogate too), but reads
  an integer past 64 bits as a float. A body with a run of 19 digits, and anything orjson refuses,
  is read by the Python parser: what is accepted, and the error raised, are the Python path's.
  Text is read as its UTF-8 bytes (an SSE answer's events are text: Python's parser took seven
  times as long on them); what ``json.loads`` reads differently in text and in bytes (a byte
  order mark, UTF-16 and UTF-32) orjson refuses, so the Python parser reads the text as before.
- ``dumps``: compact, non-ASCII written as UTF-8 (as the MCP SDK writes it); what orjson cannot
  write (an integer past 64 bits, a key that is not a string, an unpaired surrogate) is written
  by ``json.dumps``, as before.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

try:
    import orjson
except ImportError:  # pragma: no cover - a platform without its wheel: Python's json serves
    orjson = None  # type: ignore[assignment]

#: What a refusal says; a caller's body is never quoted back.
NOT_FINITE: Final = "NaN, Infinity and numbers too large for a float (1e400) are not JSON (RFC 8259)"
SURROGATE: Final = "an unpaired UTF-16 surrogate (\\ud800 to \\udfff) is not text (RFC 8259, RFC 7493)"

#: Where a surrogate can come from: a \uD800-\uDFFF escape, or one encoded raw (in text; in
#: bytes as CESU-8, which ``json.loads`` decodes with ``surrogatepass``). Only a body holding
#: one is checked.
_SURROGATE_HINT: Final = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_SURROGATE_HINT_BYTES: Final = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
#: What orjson reads differently: an integer past 64 bits (as a float). A body holding a run of
#: 19 digits is read by the Python parser. Found by mapping every digit to "0" and the rest to
#: " " (``bytes.translate``, C) and looking for 19 "0"s: a regular expression took six times as
#: long as orjson's whole parse, on every body in both directions of every call.
_DIGITS_AS_ZEROS: Final = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN: Final = b"0" * 19


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
    if orjson is not None:
        # Text (an SSE event's data) as its UTF-8 bytes; a lone surrogate in it as CESU-8 bytes,
        # which orjson refuses, so the Python parser reads the text itself, as for bytes.
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        if _LONG_RUN not in raw.translate(_DIGITS_AS_ZEROS):
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass  # refused: the Python parser says why, as it always did
    value = json.loads(data, parse_constant=_constant, parse_float=_float)
    hint = _SURROGATE_HINT.search(data) if isinstance(data, str) else _SURROGATE_HINT_BYTES.search(data)
    if hint is not None:  # rare: an escaped character outside the BMP, or a surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise NotJson(SURROGATE) from None
    return value


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON, UTF-8 (``json.dumps`` for what orjson does not write)."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":")).encode()


def sorted_dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON with its keys sorted, what is not JSON as its ``str``:
    the same bytes for the same data (a digest's input)."""
    if orjson is not None:
        try:
            return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False).encode()
