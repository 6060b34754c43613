"""What a ``haltwire demo loop`` scenario observed, what it expected, and how the two differ.

``ScenarioResult`` holds one scenario's table rows, notes and numbers; its ``deviations``
name every number that differs from the seed's. The helpers read those numbers: an agent's
log (``observe``), the demo upstream's counters, and the HTTP statuses that went over the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from haltwire.demo.agent import AgentLog
from haltwire.demo.upstream import DemoUpstream


@dataclass(slots=True)
class Row:
    """One line of a scenario's table: what one agent did."""

    who: str
    calls: int
    served: int
    refused: int
    ended: str
    last: str

    @classmethod
    def of(cls, log: AgentLog, who: str | None = None) -> Row:
        refused = log.refused + (1 if log.raised is not None else 0)
        return cls(who or log.agent, log.calls, log.served, refused, log.stopped_by, log.describe_last())


@dataclass(slots=True)
class ScenarioResult:
    number: int
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def deviations(self) -> list[str]:
        if self.error is not None:
            return [f"the scenario failed: {self.error}"]
        out = []
        for key, want in self.expected.items():
            got = self.observed.get(key, "(not observed)")
            if got != want:
                out.append(f"{key}: expected {want!r}, got {got!r}")
        return out

    @property
    def ok(self) -> bool:
        return not self.deviations

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": self.title,
            "ok": self.ok,
            "deviations": self.deviations,
            "agents": self.logs,
            "rows": [
                {
                    "who": r.who,
                    "calls": r.calls,
                    "served": r.served,
                    "refused": r.refused,
                    "ended": r.ended,
                    "last": r.last,
                }
                for r in self.rows
            ],
            "notes": self.notes,
            "expected": self.expected,
            "observed": self.observed,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def observe(prefix: str, log: AgentLog) -> dict[str, Any]:
    last = log.last
    return {
        f"{prefix}.calls": log.calls,
        f"{prefix}.served": log.served,
        f"{prefix}.refused": log.refused,
        f"{prefix}.stopped_by": log.stopped_by,
        f"{prefix}.last.code": last.code if last else None,
        f"{prefix}.last.retryable": last.retryable if last else None,
    }


def upstream_counts(demo: DemoUpstream) -> dict[str, int]:
    return {"upstream.served": sum(demo.served.values()), "upstream.refused": sum(demo.refused.values())}


def upstream_note(demo: DemoUpstream) -> str:
    u = upstream_counts(demo)
    return f"upstream served {u['upstream.served']}, refused {u['upstream.refused']}"


@contextmanager
def http_error_statuses(url: str) -> Iterator[list[int]]:
    """The status of every HTTP response of 400 or more that this process's clients got from ``url``.

    Read from the HTTP client's own request log, so it is what went over the wire; the
    official MCP client turns these responses into an exception without the status.
    """
    statuses: list[int] = []
    logger = logging.getLogger("httpx2")
    saved_level = logger.level
    shown_from = logger.getEffectiveLevel()

    def capture(record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and str(args[1]).startswith(url):
            status = args[3]
            if isinstance(status, int) and status >= 400:
                statuses.append(status)
        # Pass on only what would have been logged without this capture.
        return record.levelno >= shown_from

    logger.addFilter(capture)
    logger.setLevel(min(shown_from, logging.INFO))
    try:
        yield statuses
    finally:
        logger.removeFilter(capture)
        logger.setLevel(saved_level)
