"""Paging: on-call told of stops, escalations and shadow firings (``[[notify]]``), without ever
delaying or failing what it reports.

The path of a page:

1. ``pages.page(plane, event)`` writes one row per receiver that wants the event (``NotifyTarget.wants``)
   to the page outbox (``store.pages``), inside the caller's transaction: ``stops.issue`` pages in
   the stop's own transaction, so the stop and its pages commit together (a crash after the commit
   loses no page; a stop that rolls back pages no one). The stop path pays one INSERT per receiver,
   and no network at all.
2. After the commit, the sender (``haltwire.control.routes.paging``, one task per receiver, in the
   control plane's main process) is woken with the watchers, and works each receiver's pages in
   order: ``claim`` the oldest, build its content (``content``: from the run report the API
   serves, so the two match), post it, ``settle`` it. A receiver that is down or hangs holds up only
   its own pages: each attempt has a deadline, a failed one is retried with a doubling wait
   (``first_retry_s`` up to ``max_retry_s``), a page is given up ``give_up_after_s`` after it was
   written, and past ``max_pending`` waiting pages the oldest are dropped.
3. Every outcome is an audit record of its own (not in any stop's transaction), targeting the
   stop (so the run report's timeline shows when on-call was paged): ``page.deliver`` (ok, with the
   attempts it took), ``page.retry`` (refused: the first failed attempt, so a late page is visible
   while it is retried; later failures are counted, not each recorded), ``page.give_up`` and
   ``page.drop`` (refused).

Delivery is at least once: a sender that dies between the post and the settle leaves the page
claimed, and another attempt goes once the claim runs out. Receivers deduplicate by ``page_id``
(PagerDuty by ``dedup_key``, the stop id).

``page`` and ``Event`` live in ``haltwire.control.pages`` (what is owed, without the sending, so
the rules that write stops import no report). Other rules page through ``pages.page`` with an
``Event`` of kind ``escalation`` or ``shadow``; inside
a transaction of theirs the page commits with it, and is sent once the sender wakes (at the next
registry change, or within ``POLL_S``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from haltwire.control.config import Caller, ControlConfig
from haltwire.control.errors import Refused
from haltwire.control.pages import Event
from haltwire.control.plane import Plane, excerpt
from haltwire.control.receivers import NotifyTarget
from haltwire.control.reports import RunReport, TimelineEntry, report
from haltwire.intents import Intent
from haltwire.stops import StopRecord
from haltwire.store.audit import AuditRecord
from haltwire.store.pages import PageRecord

#: Who the page records are by, and who reads the run report a page carries.
PAGER: Final = Caller("notify", "viewer")
#: The sender looks for pages at least this often, besides being woken by registry changes.
POLL_S: Final = 0.5
#: A receiver whose oldest page waits for its retry is looked at again at least this often
#: (for pages to drop or give up), and not at every registry change: a stop costs it nothing.
RECHECK_S: Final = 5.0
#: How many audit records of the run, up to the event's own, a page names as what triggered it.
TRIGGER_RECORDS: Final = 10
#: A claim outlasts an attempt's deadline by this much before another replica may try the page.
CLAIM_MARGIN_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class Receiver:
    """A ``[[notify]]`` entry with its secrets read from the environment (at start-up)."""

    target: NotifyTarget
    url: str
    routing_key: str | None
    secret: bytes | None

    @property
    def name(self) -> str:
        return self.target.name


def receivers(config: ControlConfig) -> list[Receiver]:
    """Every receiver, its secrets read now; ``ConfigError`` naming the key of one unset."""
    return [Receiver(t, t.address(), t.key(), t.signing_secret()) for t in config.notify]


@dataclass(frozen=True, slots=True)
class Content:
    """What a page says, read when it is sent: the event, the stop as it stands, the run's report
    (as ``GET /v1/runs/{id}/report`` serves it) and its link, or for a stop of a wider scope the
    intents it cancelled; and the audit records that triggered it."""

    page: PageRecord
    event: Event
    stop: StopRecord | None
    run_id: str | None
    report: RunReport | None
    report_url: str | None
    cancelled: list[Intent]
    trigger: list[TimelineEntry]


def _entry(r: AuditRecord) -> TimelineEntry:
    drill = r.detail.get("drill") is True
    return TimelineEntry(r.seq, r.at, r.actor, r.role, r.action, r.target, r.outcome, r.reason, r.malformed, drill)


def _trigger(timeline: list[TimelineEntry], event: Event) -> list[TimelineEntry]:
    """The records up to and including the event's own (the first about its subject or scope
    written once it happened: older records of the same scope are of earlier events)."""
    own = next(
        (i for i, t in enumerate(timeline) if t.target in (event.subject, event.scope) and t.at >= event.at),
        None,
    )
    end = len(timeline) if own is None else own + 1
    return [t for t in timeline[:end] if not t.action.startswith("page.")][-TRIGGER_RECORDS:]


async def content(plane: Plane, receiver: Receiver, page_: PageRecord) -> Content:
    """The page's content, read now (the report as it stands when the page is sent)."""
    stores = plane.open
    event = Event.from_facts(page_.facts)
    stop = await stores.registry.get_stop(event.subject) if event.kind == "stop" else None
    run_id = event.run
    run_report: RunReport | None = None
    if run_id is not None:
        try:
            run_report = await report(plane, PAGER, run_id)
        except Refused:  # no such run (a run: stop may name a run never registered)
            run_report = None
    base = receiver.target.report_url_base
    url = f"{base.rstrip('/')}/v1/runs/{run_id}/report" if base and run_report is not None else None
    if run_report is not None:
        cancelled = run_report.cancelled
        trigger = _trigger(run_report.timeline, event)
    else:
        records = [r for r in await stores.audit.records(target=event.scope) if r.target == event.scope]
        records += await stores.audit.records(target=event.subject)
        records.sort(key=lambda r: r.seq)
        mine = [r for r in records if event.subject in (r.target, r.detail.get("stop_id"))]
        ids = [i for r in mine if r.action == "intent.cancel" for i in r.detail.get("intents", [])]
        cancelled = [
            i for i in [await stores.intents.get(x) for x in ids if isinstance(x, str)] if i is not None
        ]
        trigger = _trigger([_entry(r) for r in mine], event)
    return Content(page_, event, stop, run_id, run_report, url, cancelled, trigger)


Result = Literal["delivered", "failed"]


def backoff(receiver: Receiver, attempts: int) -> float:
    """The wait after the ``attempts``-th failed attempt."""
    t = receiver.target
    return float(min(t.max_retry_s, t.first_retry_s * 2 ** max(0, min(attempts - 1, 30))))


async def drop_excess(plane: Plane, receiver: Receiver) -> list[str]:
    """Past ``max_pending`` pages waiting for the receiver, drop the oldest (one audit record)."""
    stores = plane.open
    if await stores.pages.pending(receiver.name) <= receiver.target.max_pending:
        return []
    now = time.time()
    async with plane.transaction():
        ids = await stores.pages.drop_oldest(receiver.name, receiver.target.max_pending, now)
        if ids:
            reason = f"{len(ids)} page(s) to {receiver.name} dropped: more than {receiver.target.max_pending} waiting"
            await plane.audit(
                PAGER,
                "page.drop",
                f"notify:{receiver.name}",
                "refused",
                reason,
                receiver=receiver.name,
                pages=ids,
            )
    return ids


async def claim(plane: Plane, receiver: Receiver, now: float) -> PageRecord | float | None:
    """The receiver's oldest page, claimed for one attempt; or when it is due (it waits for its
    retry, or another replica holds it); or None when nothing waits. A page past
    ``give_up_after_s`` is given up (audited) and the next one looked at."""
    stores = plane.open
    while True:
        head = await stores.pages.head(receiver.name)
        if head is None:
            return None
        if now >= head.created_at + receiver.target.give_up_after_s:
            await settle(
                plane, receiver, head, "failed", head.attempts, "not delivered in time", give_up=True
            )
            continue
        due = max(head.next_at, head.claimed_until)
        if due > now:
            return due
        until = now + receiver.target.timeout_s + CLAIM_MARGIN_S
        if await stores.pages.claim(head.page_id, now, until):
            return head
        return now + POLL_S  # another replica holds it


async def settle(
    plane: Plane,
    receiver: Receiver,
    page_: PageRecord,
    result: Result,
    attempts: int,
    detail: str,
    give_up: bool = False,
) -> None:
    """Record an attempt's end with its audit record, in one transaction."""
    stores = plane.open
    now = time.time()
    facts: dict[str, Any] = {
        "page_id": page_.page_id,
        "receiver": receiver.name,
        "event": page_.event,
        "attempts": attempts,
    }
    async with plane.transaction():
        if result == "delivered":
            await stores.pages.settle(page_.page_id, "delivered", attempts, page_.next_at, now)
            reason = f"paged {receiver.name} ({receiver.target.kind}) after {attempts} attempt(s): {detail}"
            await plane.audit(PAGER, "page.deliver", page_.subject, "ok", reason, **facts)
        elif (
            give_up or now + backoff(receiver, attempts) >= page_.created_at + receiver.target.give_up_after_s
        ):
            await stores.pages.settle(page_.page_id, "given_up", attempts, page_.next_at, now)
            reason = f"gave up paging {receiver.name} after {attempts} attempt(s): {excerpt(detail)}"
            await plane.audit(PAGER, "page.give_up", page_.subject, "refused", reason, **facts)
        else:
            next_at = now + backoff(receiver, attempts)
            await stores.pages.settle(page_.page_id, "pending", attempts, next_at, 0.0)
            if attempts == 1:
                reason = f"paging {receiver.name} failed: {excerpt(detail)}; retried with backoff"
                await plane.audit(
                    PAGER, "page.retry", page_.subject, "refused", reason, **facts, next_at=next_at
                )
