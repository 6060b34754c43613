"""What gateways report for the run report: the calls a stop found in flight
(``POST /v1/runs/{run_id}/calls``) and the model tokens a run used (``POST /v1/runs/{run_id}/usage``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.config import Label
from haltwire.control import calls, usage
from haltwire.control.routes.fields import Id, Name, Time
from haltwire.control.routes.runs import RunId
from haltwire.control.routes.views import CallsRecorded
from haltwire.control.routes.wire import UNKNOWN_RUN, Body, Route, body, caller, plane_of
from haltwire.limits import MAX_CALLS_PER_REPORT
from haltwire.stops import CallOutcome


class CallBody(Body):
    """One call: what the gateway did with it after the stop, and when (by its clock)."""

    call_id: Id
    tool: Name
    label: Label
    stop_id: Id
    outcome: CallOutcome
    started_at: Time
    stopped_at: Time
    ended_at: Time


class CallsBody(Body):
    calls: list[CallBody] = Field(min_length=1, max_length=MAX_CALLS_PER_REPORT)


async def record_calls(request: Request, run_id: RunId) -> Response:
    """Record what a gateway did with a run's calls that a stop found in flight"""
    who = await caller(request, calls.RECORD, run_id, write=True)
    asked = await body(request, who, CallsBody, calls.RECORD, run_id)
    said = [c.model_dump() for c in asked.calls]
    done = await calls.record(plane_of(request), who, run_id, said)
    answer: CallsRecorded = {"recorded": done.recorded, "repeated": done.repeated}
    return JSONResponse(answer)


class UsageItem(Body):
    """What a run's calls to one model used since the gateway's last report."""

    report_id: Id
    model: Name
    calls: int = Field(ge=1)
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cost_micros: int = Field(ge=0)


class UsageBody(Body):
    usage: list[UsageItem] = Field(min_length=1, max_length=MAX_CALLS_PER_REPORT)


async def record_usage(request: Request, run_id: RunId) -> Response:
    """Record the model tokens and cost a gateway counted for a run"""
    who = await caller(request, usage.RECORD, run_id, write=True)
    asked = await body(request, who, UsageBody, usage.RECORD, run_id)
    recorded, repeated = await usage.record(plane_of(request), who, run_id, [u.model_dump() for u in asked.usage])
    answer: CallsRecorded = {"recorded": recorded, "repeated": repeated}
    return JSONResponse(answer)


_ANSWER: tuple[Literal[200], type, str] = (
    200,
    CallsRecorded,
    "the calls recorded, each as an audit record of the run (repeated: call ids recorded before)",
)

routes = [
    Route(
        "POST",
        "/v1/runs/{run_id}/calls",
        record_calls,
        calls.RECORD,
        _ANSWER,
        (
            UNKNOWN_RUN,
            (422, "invalid_request: a field is missing or out of bounds, or no stop has a stop_id"),
            503,
        ),
        body=CallsBody,
    ),
    Route(
        "POST",
        "/v1/runs/{run_id}/usage",
        record_usage,
        usage.RECORD,
        (200, CallsRecorded, "each item recorded as an audit record of the run (repeated: report ids recorded before)"),
        (UNKNOWN_RUN, (422, "invalid_request: a field is missing or out of bounds"), 503),
        body=UsageBody,
    ),
]
