"""Model tokens and their cost a run used, as its gateways counted them, for the run report
(issue 14).

A gateway reports what its model calls of a run used (``POST /v1/runs/{id}/usage``, role
``gateway``), summed per model over the calls it served since its last report. ``record``
writes one audit record per reported item (action ``model.usage``, target the item's
``report_id``, the run, model, tokens and cost in its detail), all of a request's items in one
transaction or none; a repeated ``report_id`` (a retry whose answer was lost) is not recorded
again. The run report sums them (``run_usage``) from the records it already reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from haltwire.control.config import Caller
from haltwire.control.plane import Plane
from haltwire.control.runs import run_for
from haltwire.store.audit import AuditRecord

#: The audit action of one usage report.
ACTION: Final = "model.usage"
#: The ``ROLES`` action of recording them.
RECORD: Final = "run.usage.record"


@dataclass(slots=True)
class ModelUsage:
    """What the run's calls to one model used (cost in millionths of the price's unit; 0 when
    the gateway's ``[[models]] prices`` names none)."""

    model: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0


@dataclass(slots=True)
class RunUsage:
    """The run's model usage, in all and per model."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    models: list[ModelUsage] = field(default_factory=list)


async def record(plane: Plane, caller: Caller, run_id: str, items: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Record ``items`` (``report_id``, ``model``, ``calls``, ``input_tokens``,
    ``output_tokens``, ``cost_micros``) of one run: how many were recorded, and repeated."""
    await run_for(plane, caller, run_id, RECORD, audit=True)
    recorded = repeated = 0
    async with plane.transaction():
        for item in items:
            if await plane.recorded(ACTION, item["report_id"]):
                repeated += 1
                continue
            detail = {k: v for k, v in item.items() if k != "report_id"}
            reason = f"{item['calls']} call(s) to {item['model']}"
            await plane.audit(caller, ACTION, item["report_id"], "ok", reason, run_id=run_id, **detail)
            recorded += 1
    return recorded, repeated


def run_usage(records: Iterable[AuditRecord], run_id: str) -> RunUsage:
    """The run's usage summed from its audit records (first record per report id)."""
    per_model: dict[str, ModelUsage] = {}
    seen: set[str] = set()
    for r in records:
        if r.action != ACTION or r.detail.get("run_id") != run_id or r.target in seen:
            continue
        d = r.detail
        raw = [d.get(k) for k in ("calls", "input_tokens", "output_tokens", "cost_micros")]
        counts = [c for c in raw if type(c) is int and c >= 0]
        model = d.get("model")
        if not isinstance(model, str) or len(counts) != len(raw):
            continue  # not a record this module wrote (tampered with): the timeline still shows it
        seen.add(r.target)
        m = per_model.setdefault(model, ModelUsage(model))
        m.calls += counts[0]
        m.input_tokens += counts[1]
        m.output_tokens += counts[2]
        m.cost_micros += counts[3]
    models = sorted(per_model.values(), key=lambda m: m.model)
    return RunUsage(
        sum(m.calls for m in models),
        sum(m.input_tokens for m in models),
        sum(m.output_tokens for m in models),
        sum(m.cost_micros for m in models),
        models,
    )


__all__ = ["ACTION", "RECORD", "ModelUsage", "RunUsage", "record", "run_usage"]
