"""Content signals: the hook the ``content`` rule calls on a tool result's text.

The detectors themselves (what counts as an injected instruction) live in
``haltwire.tripwires.detectors`` (``load_detector``, ``result_text``, the ``Detector`` and
``Signal`` shapes), written apart from the rules. This module is the rule's side of that
interface: ``load`` and ``text_of`` use that module when it is installed, and otherwise a small
fallback of the same shape (``PhraseDetector``, ``detector = "builtin"``), so the hook works and
is tested on its own. The engine needs of a detector only ``scan(text)`` returning signals that
have a ``detector``, a ``kind`` and an ``evidence`` excerpt.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from haltwire.config import ConfigError


class SignalLike(Protocol):
    @property
    def detector(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def evidence(self) -> str: ...


class Detector(Protocol):
    @property
    def name(self) -> str: ...

    def scan(self, text: str) -> Sequence[SignalLike]: ...


@dataclass(frozen=True, slots=True)
class Signal:
    """What the fallback detector found (the shape of ``detectors.Signal``)."""

    detector: str
    kind: str
    evidence: str
    score: float = 1.0


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

    def scan(self, text: str) -> list[Signal]:
        found = _INJECTED.search(text)
        if found is None:
            return []
        return [Signal(self.name, "instruction_override", found.group(0)[:160])]


@functools.cache
def _detectors() -> Any:
    """``haltwire.tripwires.detectors`` when installed, else None (looked for once)."""
    try:
        return importlib.import_module("haltwire.tripwires.detectors")
    except ModuleNotFoundError:
        return None


def load(spec: str) -> Detector:
    """The detector a rule names (at start-up; a bad name is an error there)."""
    module = _detectors()
    if module is not None:
        found: Detector = module.load_detector(spec)
        return found
    if spec == "builtin":
        return PhraseDetector()
    raise ConfigError(f"tripwires: detector: no detector is named {spec!r}")


def text_of(result: Mapping[str, Any]) -> str:
    """The text a tool result shows the model: its text content and its structured content."""
    module = _detectors()
    if module is not None:
        text: str = module.result_text(result)
        return text
    parts = [c.get("text", "") for c in result.get("content") or () if isinstance(c, dict)]
    structured = result.get("structuredContent")
    if structured is not None:
        parts.append(str(structured))
    return "\n".join(p for p in parts if isinstance(p, str))
