"""What a content detector reports (``Signal``) and what a detector is (``Detector``).

Kept apart from ``detectors`` so the built-in detector and the loader can both import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

#: Kinds the built-in detector reports. A model-based detector names its own (default "model").
INSTRUCTION_OVERRIDE: Final = "instruction_override"
ROLE_MARKER: Final = "role_marker"
INVISIBLE_UNICODE: Final = "invisible_unicode"
EXFILTRATION: Final = "exfiltration"

#: The longest evidence excerpt, in characters after escaping.
EVIDENCE_CHARS: Final = 160


@dataclass(frozen=True, slots=True)
class Signal:
    """One reason to believe a text carries an injection.

    ``evidence`` is a short excerpt (at most ``EVIDENCE_CHARS``), escaped by ``escape``, so it
    is one printable line that is safe to log and to put in an audit record. ``score``: 1.0 for
    a pattern that trips alone, the sum of the weights of weak cues that tripped together (1.0
    or more), or a model's score (up to 1.0).
    """

    detector: str
    kind: str
    evidence: str
    score: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "kind": self.kind, "evidence": self.evidence, "score": self.score}


@runtime_checkable
class Detector(Protocol):
    """A content detector: ``scan`` a tool result's text, return what it found (empty: nothing).

    ``scan`` is synchronous and pure (no I/O, no state between calls), and its cost is bounded
    by the length of its input, which the caller bounds (``result_text`` returns at most
    ``MAX_SCAN_CHARS``). The built-in detector is linear in the text and never raises; a
    model-based one may raise, and the caller decides what a failing detector means.
    """

    @property
    def name(self) -> str: ...

    def scan(self, text: str) -> Sequence[Signal]: ...


#: Printable to ``str.isprintable`` but invisible: soft hyphen, combining grapheme joiner,
#: Hangul fillers, Mongolian and Unicode variation selectors.
_HIDDEN_PRINTABLE: Final = re.compile("[\u00ad\u034f\u115f\u1160\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]")


def escape(text: str, limit: int = EVIDENCE_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters.

    Invisible, control and format characters (zero-width, bidi controls, tag characters, line
    breaks) become ``\\uXXXX``/``\\n`` escapes, so a log or an audit record shows what was there
    and carries no character that reorders or hides what is around it.
    """
    out: list[str] = []
    size = 0
    for ch in text:
        if ch == "\\":
            piece = "\\\\"
        elif ch == "\n":
            piece = "\\n"
        elif ch.isprintable() and not _HIDDEN_PRINTABLE.match(ch):
            piece = ch
        else:
            code = ord(ch)
            piece = f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
        size += len(piece)
        if size > limit:
            out.append("…")
            break
        out.append(piece)
    return "".join(out)


def excerpt(text: str, start: int, end: int, margin: int = 40) -> str:
    """``text[start:end]`` with ``margin`` characters either side, unescaped (``escape`` it)."""
    lo, hi = max(0, start - margin), min(len(text), end + margin)
    return ("…" if lo else "") + text[lo:hi] + ("…" if hi < len(text) else "")
