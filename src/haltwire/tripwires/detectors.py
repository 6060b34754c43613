"""Content signals on tool output: the ``Detector`` interface, the built-in one, the adapter.

The gateway's content rule (``[[tripwires]] kind = "content"``) calls, per tool result::

    detector = load_detector(rule.detector)          # once, at start-up: a ConfigError if bad
    signals = detector.scan(result_text(result))     # per result: empty, or why it trips

``result_text`` is what the model may read of a result: every text item, embedded text
resources, resource links' names and descriptions, and every string (keys too) of
``structuredContent``, since MCP clients may hand either to the model. It is bounded to
``MAX_SCAN_CHARS``. A model-based detector is any importable object that satisfies
``Detector``; ``ScoreThreshold`` makes one out of a function ``text -> float``.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from haltwire.config import ConfigError
from haltwire.tripwires.builtin import MAX_SCAN_CHARS, BuiltinDetector
from haltwire.tripwires.signal import (
    EXFILTRATION,
    INSTRUCTION_OVERRIDE,
    INVISIBLE_UNICODE,
    ROLE_MARKER,
    Detector,
    Signal,
)

log = logging.getLogger("haltwire.tripwires")

__all__ = [
    "EXFILTRATION",
    "INSTRUCTION_OVERRIDE",
    "INVISIBLE_UNICODE",
    "MAX_SCAN_CHARS",
    "ROLE_MARKER",
    "BuiltinDetector",
    "Detector",
    "ScoreThreshold",
    "Signal",
    "load_detector",
    "result_text",
]

#: Nesting of ``structuredContent`` walked (deeper values are not read).
_MAX_DEPTH: Final = 32


def result_text(result: Mapping[str, Any], limit: int = MAX_SCAN_CHARS) -> str:
    """All text the model may read in an MCP ``CallToolResult`` (a dict), at most ``limit`` chars.

    Content items first, in order (``text``; a ``resource``'s ``text``; a ``resource_link``'s
    ``name``, ``title``, ``description`` and ``uri``; images and audio carry no text), then the
    strings of ``structuredContent`` (keys and values, depth first), one per line. Anything
    malformed is skipped, never raised on.
    """
    parts: list[str] = []
    size = 0
    for piece in _pieces(result):
        parts.append(piece)
        size += len(piece) + 1
        if size >= limit:
            break
    return "\n".join(parts)[:limit]


def _pieces(result: Mapping[str, Any]) -> Iterator[str]:
    content = result.get("content")
    for item in content if isinstance(content, list) else ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "text":
            yield from _strings(item.get("text"))
        elif kind == "resource" and isinstance(resource := item.get("resource"), dict):
            yield from _strings(resource.get("text"))
        elif kind == "resource_link":
            for key in ("name", "title", "description", "uri"):
                yield from _strings(item.get(key))
    if (structured := result.get("structuredContent")) is not None:
        yield from _walk(structured, 0)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str) and value:
        yield value


def _walk(value: object, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        yield from _strings(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _walk(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, depth + 1)


class ScoreThreshold:
    """A detector from a scoring function: one signal when ``score(text) >= threshold``.

    The adapter for a model the user installs (a prompt-injection classifier): ``score`` gets
    the text (in ``chunk_chars`` pieces if given, the highest score counting, since such models
    read a bounded window) and returns a probability of injection. A score that is not a
    finite number raises ``ValueError``; what the model raises is raised.
    """

    def __init__(
        self,
        score: Callable[[str], float],
        *,
        threshold: float = 0.5,
        name: str = "model",
        kind: str = "model",
        chunk_chars: int | None = None,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be within 0..1, not {threshold!r}")
        if chunk_chars is not None and chunk_chars < 1:
            raise ValueError(f"chunk_chars must be positive, not {chunk_chars!r}")
        self._score, self._threshold, self._name, self._kind = score, threshold, name, kind
        self._chunk = chunk_chars

    @property
    def name(self) -> str:
        return self._name

    def scan(self, text: str) -> list[Signal]:
        size = self._chunk or max(len(text), 1)
        best, at = 0.0, 0
        for start in range(0, max(len(text), 1), size):
            value = float(self._score(text[start : start + size]))
            if not math.isfinite(value):
                raise ValueError(f"detector {self._name!r} scored {value!r}")
            if value > best:
                best, at = value, start
        if best < self._threshold:
            return []
        evidence = f"score {best:.3f} >= {self._threshold} at character {at}"
        return [Signal(self._name, self._kind, evidence, round(min(best, 1.0), 3))]


def scan(detector: Detector, name: str, tool: str, wire: Mapping[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """A content rule's look at a result: None, or its firing's detail, figures and what the
    refusal tells the model (the signals' kinds, never the text: the model must not read it).
    A detector that fails fails closed, like any tripwire."""
    try:
        signals = detector.scan(result_text(wire))
    except Exception as exc:  # a model-based detector may fail
        log.exception("detector %s failed on the result of %s", name, tool)
        signals = [Signal(name, "detector_failed", f"{type(exc).__name__}: {exc}"[:160])]
    if not signals:
        return None
    found = "; ".join(f"{x.detector} {x.kind}: {x.evidence!r}" for x in signals[:3])
    kinds = sorted({x.kind for x in signals})
    figures = {"signals": len(signals), "tool": tool, "kinds": kinds}
    return f"content signals in the result of {tool}: {found}", figures, f"{', '.join(kinds)} in the result of {tool}, withheld"


def load_detector(spec: str) -> Detector:
    """The detector a content rule names: ``"builtin"``, or ``"module:attribute"``.

    ``module:attribute`` is imported (``attribute`` may be dotted); a class or factory is
    called without arguments, an object that already has ``scan`` is used as it is. The result
    must have a string ``name`` and a callable ``scan``. Any failure is a ``ConfigError``
    naming ``spec``.
    """
    if spec == "builtin":
        return BuiltinDetector()
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f'detector {spec!r}: expected "builtin" or "module:attribute" (e.g. "mypkg.detect:Guard")')
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or whatever the module raised while importing
        raise ConfigError(f"detector {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"detector {spec!r}: {module_name!r} has no attribute {attribute!r}") from None
    if not callable(getattr(target, "scan", None)) or isinstance(target, type):
        if not callable(target):
            raise ConfigError(f"detector {spec!r}: {attribute!r} is neither a detector nor callable")
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"detector {spec!r}: creating it failed: {exc}") from exc
    if not (isinstance(getattr(target, "name", None), str) and callable(getattr(target, "scan", None))):
        raise ConfigError(f"detector {spec!r}: not a detector (needs a str name and a scan(text) method)")
    detector: Detector = target
    return detector
