"""Content signals: the hook the ``content`` rule calls on a tool result's text.

The rule kind and its hook live here; the detectors themselves (what counts as an injected
instruction) are written against ``Detector`` in ``haltwire.tripwires.detectors`` when that
module exists. Until it does, ``detector = "builtin"`` is a small fallback below, so the hook
can be exercised end to end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Signal:
    """What a detector found: its name, a short description, and the text that matched."""

    detector: str
    what: str
    evidence: str


class Detector(Protocol):
    name: str

    def scan(self, text: str) -> Signal | None: ...


#: Phrases of an instruction aimed at the model rather than at a reader (the fallback's list).
_INJECTED = re.compile(
    r"ignore (all |any )?(the )?(previous|prior|above) (instructions|prompts?)"
    r"|disregard (all |any )?(the )?(previous|prior|above) (instructions|prompts?)"
    r"|you are now (in )?[a-z ]{0,20}mode"
    r"|new instructions?:"
    r"|system prompt:",
    re.IGNORECASE,
)


class PhraseDetector:
    """The fallback ``builtin`` detector: a handful of injection phrases."""

    name = "builtin"

    def scan(self, text: str) -> Signal | None:
        found = _INJECTED.search(text)
        if found is None:
            return None
        return Signal(self.name, "an instruction addressed to the model", found.group(0)[:200])


def detector(name: str) -> Detector:
    """The detector a rule names (``ValueError`` for an unknown one)."""
    try:
        from haltwire.tripwires import detectors  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        detectors = None
    if detectors is not None:
        found = getattr(detectors, "detector", None)
        if callable(found):
            d: Detector = found(name)
            return d
    if name == "builtin":
        return PhraseDetector()
    raise ValueError(f"no detector is named {name!r}")


def result_text(result: dict[str, Any]) -> str:
    """The text a tool result shows the model: its text content and its structured content."""
    parts = [c.get("text", "") for c in result.get("content") or () if isinstance(c, dict)]
    structured = result.get("structuredContent")
    if structured is not None:
        parts.append(str(structured))
    return "\n".join(p for p in parts if isinstance(p, str))
