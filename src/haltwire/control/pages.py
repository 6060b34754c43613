"""Pages owed: what a rule that writes a stop, an escalation or a shadow firing tells on-call.

``page(plane, event)`` writes one row per receiver of ``[[notify]]`` that wants the event to the
page outbox, inside the caller's transaction, and nothing else: the sending, the content and the
retries are ``haltwire.control.notify``'s, after the commit.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from haltwire.control.config import ControlConfig
from haltwire.control.plane import Plane
from haltwire.control.receivers import NotifyTarget, PageEvent
from haltwire.stops import StopRecord
from haltwire.store.pages import PageRecord

__all__ = ["Event", "page", "stop_event", "wanting"]

_last_ns = 0


def page_id() -> str:
    """A new page's id, later than every id this process made before: receivers get pages in
    ``(created_at, page_id)`` order, so pages written in one transaction (a stop and the
    escalation it causes) go out in the order they were written."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"pg_{_last_ns:016x}{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class Event:
    """What a page reports. ``subject``: what it is about (a stop's id; an escalation's stop; a
    shadow firing's own id), the target of its delivery records. ``run_id``: the run whose report
    the page carries (a ``run:`` scope's run when not given). ``rule``: the rule that fired,
    when a rule did. ``detail``: anything else for the page (JSON)."""

    kind: PageEvent
    subject: str
    scope: str
    reason: str
    actor: str
    at: float
    run_id: str | None = None
    rule: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def run(self) -> str | None:
        if self.run_id is not None:
            return self.run_id
        kind, _, rest = self.scope.partition(":")
        return rest if kind == "run" and rest else None

    def facts(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> Event:
        return cls(**{k: facts[k] for k in cls.__dataclass_fields__ if k in facts})


def stop_event(stop: StopRecord, rule: str | None = None, kind: PageEvent = "stop") -> Event:
    """The event of a stop just issued (``escalation``: a stop an escalation rule wrote)."""
    return Event(kind, stop.stop_id, stop.scope, stop.reason, stop.issued_by, stop.issued_at, rule=rule)


def wanting(config: ControlConfig, event: Event) -> list[NotifyTarget]:
    return [t for t in config.notify if t.wants(event.kind, event.scope)]


async def page(plane: Plane, event: Event) -> list[str]:
    """Owe ``event`` to every receiver that wants it: the ids of the pages written (none when no
    receiver does). Inside an open transaction the pages commit with it; ``plane.notify()`` after
    the commit sends them at once (``stops.issue`` does), else the sender finds them within
    ``POLL_S``."""
    targets = wanting(plane.config, event)
    if not targets:
        return []
    # A producer's detail that is not JSON is written as text rather than failing its transaction.
    facts = json.loads(json.dumps(event.facts(), default=str))
    rows = [
        PageRecord(
            page_id(), t.name, event.kind, event.subject, facts, event.at, next_at=event.at
        )
        for t in targets
    ]
    await plane.open.pages.add(rows)
    return [r.page_id for r in rows]
