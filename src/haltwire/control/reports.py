"""Run reports: what a run did, what is still in doubt, and what stopped it, in one read.

``GET /v1/runs/{run_id}/report`` derives everything from what the control plane already
records, and writes nothing; it reads what concerns the run only (the registry by scope and
time, the audit log by its index of subjects), never the whole history: the run (the run store), its intents grouped by state (the
intent store), every stop whose scope covers the run, active or cleared (the registry), and
the audit records about the run in seq order (the audit log), and the tool calls a stop found
in flight at a gateway, with what the gateway did to each (``calls``: cut, or let finish and
how they ended; ``haltwire.control.calls``), and the model tokens and cost its gateways counted
(``usage``; ``haltwire.control.usage``). ``haltwire report RUN`` prints it
(``haltwire.control.operator``).

A stop covers the run when it names one of the run's scopes (``run:``, ``agent:``,
``tenant:``, ``version:``, ``global``) and was in force while the run lived; a stop that cancelled one of the run's intents through
another scope (``tool:``) hit the run too, so it is listed as well. An agent sees only the
stops it can see anywhere else (``access.visible_to``), and the records about those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from haltwire.control.access import visible_to
from haltwire.control.calls import StoppedCall, stopped_calls
from haltwire.control.config import Caller
from haltwire.control.plane import Plane
from haltwire.control.runs import run_for
from haltwire.control.usage import RunUsage, run_usage
from haltwire.intents import Intent, IntentState
from haltwire.stops import StopRecord
from haltwire.store.audit import AuditRecord, Outcome
from haltwire.store.runs import RunRecord

#: Report section -> the intent states it lists. ``claimed`` is in flight: like ``unknown``,
#: its outcome is not known until the executor records it.
SECTIONS: Final[dict[str, tuple[IntentState, ...]]] = {
    "completed": ("committed",),
    "unknown": ("unknown", "claimed"),
    "failed": ("failed",),
    "cancelled": ("cancelled",),
    "awaiting_approval": ("awaiting_approval",),
    "pending": ("pending",),
    "rejected": ("rejected",),
}
#: The intents one report reads (the store lists a bounded number): far past any real run.
MAX_INTENTS: Final = 100_000


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One audit record about the run, without its hash chain (``GET /v1/audit`` has that)."""

    seq: int
    at: float
    actor: str
    role: str
    action: str
    target: str
    outcome: Outcome
    reason: str
    #: Set when the stored record is not a record (``AuditRecord.malformed``): tampered with.
    malformed: str | None = None
    #: The record is drill data (``haltwire.control.drills``).
    drill: bool = False


@dataclass(frozen=True, slots=True)
class RunReport:
    """The report's shape (the OpenAPI document derives its schema from this)."""

    run: RunRecord
    completed: list[Intent]
    unknown: list[Intent]
    failed: list[Intent]
    cancelled: list[Intent]
    awaiting_approval: list[Intent]
    pending: list[Intent]
    rejected: list[Intent]
    stops: list[StopRecord]
    #: Tool calls in flight at a gateway when a stop came: cut (cancellable) or let finish.
    calls: list[StoppedCall]
    #: Model tokens and their cost, as the gateways reported them (``haltwire.control.usage``).
    usage: RunUsage
    timeline: list[TimelineEntry]
    #: A drill run (``haltwire.control.drills``): no incident.
    drill: bool = False


def _names(value: Any) -> set[str] | None:
    """The ids a detail field lists, or None when it lists none."""
    return {v for v in value if isinstance(v, str)} if isinstance(value, list) else None


def about_run(record: AuditRecord, run_id: str, intent_ids: set[str], stop_ids: set[str]) -> bool:
    """Whether ``record`` is about the run: the run itself, one of its intents, or one of the
    stops that hit it. A record listing the runs or intents it concerns (a grouped lease
    refusal, a stop's cancellations, an executor's restart) counts only when it lists ours."""
    detail = record.detail
    if record.target == run_id or record.target in intent_ids or detail.get("run_id") == run_id:
        return True
    runs, intents = _names(detail.get("runs")), _names(detail.get("intents"))
    if runs is not None:
        return run_id in runs
    if intents is not None:
        return bool(intents & intent_ids)
    stop_id = detail.get("stop_id")
    return record.target in stop_ids or (isinstance(stop_id, str) and stop_id in stop_ids)


def _in_force_during(stop: StopRecord, run: RunRecord) -> bool:
    """Whether ``stop`` was in force at some moment of the run's life: not cleared or expired
    before the run registered, not issued after it ended (such a stop never hit it)."""
    ended_before = [t for t in (stop.cleared_at, stop.expires_at) if t is not None]
    if ended_before and min(ended_before) < run.registered_at:
        return False
    return run.ended_at is None or stop.issued_at <= run.ended_at


async def report(plane: Plane, caller: Caller, run_id: str) -> RunReport:
    """The report of one run the caller may read."""
    run = await run_for(plane, caller, run_id, "run.report", audit=False)
    stores = plane.open
    intents = await stores.intents.list(run_id=run.run_id, limit=MAX_INTENTS)
    scopes = {str(s) for s in run.scopes}
    cancelled_by = {i.stop_id for i in intents if i.stop_id is not None}
    # Only the run's own: its scopes' stops in its lifetime, and those that cancelled its intents.
    found = {
        s.stop_id: s
        for s in [
            *await stores.registry.stops_during(scopes, run.registered_at, run.ended_at),
            *await stores.registry.stops_by_id(cancelled_by),
        ]
    }
    stops = [
        s
        for s in found.values()
        if ((s.scope in scopes and _in_force_during(s, run)) or s.stop_id in cancelled_by)
        and await visible_to(plane, caller, s.scope)
    ]
    stops.sort(key=lambda s: s.revision)
    intent_ids = {i.intent_id for i in intents}
    stop_ids = {s.stop_id for s in stops}
    candidates = await stores.audit.about({run.run_id, *intent_ids, *stop_ids})
    records = [r for r in candidates if about_run(r, run.run_id, intent_ids, stop_ids)]
    timeline = [
        TimelineEntry(
            r.seq, r.at, r.actor, r.role, r.action, r.target, r.outcome, r.reason, r.malformed, r.detail.get("drill") is True
        )
        for r in records
    ]
    # The store lists oldest first; a section spanning two states keeps that order.
    sections = {section: [i for i in intents if i.state in states] for section, states in SECTIONS.items()}
    calls = stopped_calls(records, run.run_id)
    usage = run_usage(records, run.run_id)
    drill = plane.drills.of_tenant(run.tenant)
    return RunReport(run=run, **sections, stops=stops, calls=calls, usage=usage, timeline=timeline, drill=drill)
