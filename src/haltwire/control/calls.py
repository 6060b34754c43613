"""Tool calls a stop found in flight at a gateway: recorded for the run report (issue 12, point 2).

A gateway that had a run's call in flight when a stop matched it cuts the call (a
``cancellable`` tool) or lets it finish (``bounded``, ``irreversible``), and once the call has
ended it reports what happened (``POST /v1/runs/{id}/calls``, role ``gateway``). ``record``
writes one audit record per call (action ``call.in_flight``, target the call id, the run and
the rest in its detail, the call's outcome as ``call_outcome``), all of a request's calls in one transaction or none. The run report
reads them back (``stopped_calls``) from the records it already reads.

A gateway retries a report whose answer it lost, so the call id makes a repeat harmless: a call
already recorded is not recorded again (and the report keeps the first record of a call id,
should two repeats race). A stop id the registry does not know is refused: the gateway only
reports stops it followed from the watch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, get_args

from haltwire.config import Label
from haltwire.control.config import Caller
from haltwire.control.errors import invalid
from haltwire.control.plane import Plane
from haltwire.control.runs import run_for
from haltwire.stops import CallOutcome
from haltwire.store.audit import AuditRecord

#: The audit action of one call a stop found in flight.
ACTION: Final = "call.in_flight"
#: The ``ROLES`` action of recording them.
RECORD: Final = "run.calls.record"


@dataclass(frozen=True, slots=True)
class StoppedCall:
    """One call a stop found in flight, and what became of it (times by the gateway's clock)."""

    call_id: str
    tool: str
    label: Label
    stop_id: str
    outcome: CallOutcome
    started_at: float
    stopped_at: float
    ended_at: float
    #: The gateway that had it in flight (its identity's name at the control plane).
    gateway: str
    #: The audit record that holds it.
    seq: int


def _reason(call: dict[str, Any]) -> str:
    if call["outcome"] == "cancelled":
        return f"{call['label']} call {call['tool']} cut by stop {call['stop_id']}"
    return f"{call['label']} call {call['tool']} let finish after stop {call['stop_id']}: {call['outcome']}"


@dataclass(frozen=True, slots=True)
class Recorded:
    recorded: int
    repeated: int


async def record(plane: Plane, caller: Caller, run_id: str, calls: Sequence[dict[str, Any]]) -> Recorded:
    """Record ``calls`` (each with the fields of ``StoppedCall`` but ``gateway`` and ``seq``) of
    one run; refusals are audited."""
    await run_for(plane, caller, run_id, RECORD, audit=True)
    registry = plane.open.registry
    for stop_id in sorted({c["stop_id"] for c in calls}):
        if await registry.get_stop(stop_id) is None:
            problem = invalid(f"stop_id: no stop has the id {stop_id}")
            raise await plane.refuse(caller, RECORD, run_id, problem)
    recorded = repeated = 0
    async with plane.transaction():
        for call in calls:
            if await plane.recorded(ACTION, call["call_id"]):
                repeated += 1
                continue
            # ``outcome`` is the audit record's own field ("ok"): the call's is ``call_outcome``.
            detail = {("call_outcome" if k == "outcome" else k): v for k, v in call.items() if k != "call_id"}
            await plane.audit(caller, ACTION, call["call_id"], "ok", _reason(call), run_id=run_id, **detail)
            recorded += 1
    return Recorded(recorded, repeated)


def stopped_calls(records: Iterable[AuditRecord], run_id: str) -> list[StoppedCall]:
    """The run's calls a stop found in flight, from its audit records (first record per call)."""
    found: dict[str, StoppedCall] = {}
    for r in records:
        if r.action != ACTION or r.detail.get("run_id") != run_id or r.target in found:
            continue
        d = r.detail
        try:
            found[r.target] = StoppedCall(
                r.target,
                str(d["tool"]),
                _one_of(d["label"], get_args(Label)),
                str(d["stop_id"]),
                _one_of(d["call_outcome"], get_args(CallOutcome)),
                float(d["started_at"]),
                float(d["stopped_at"]),
                float(d["ended_at"]),
                r.actor,
                r.seq,
            )
        except (KeyError, TypeError, ValueError):
            continue  # not a record this module wrote (tampered with): the timeline still shows it
    return list(found.values())


def _one_of(value: Any, allowed: tuple[Any, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"{value!r} is none of {allowed}")
    return value


__all__ = ["ACTION", "RECORD", "Recorded", "StoppedCall", "record", "stopped_calls"]
