"""The route of tripwire firings in shadow mode: ``POST /v1/tripwire-firings`` (tripwires)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import firings
from haltwire.control.routes.fields import Key, Name, Text, Time
from haltwire.control.routes.stops import SCOPE_PATTERN
from haltwire.control.routes.views import FiringRecorded
from haltwire.control.routes.wire import Body, Route, body, caller, plane_of
from haltwire.limits import MAX_SCOPE_CHARS


class FiringBody(Body):
    """What a rule would have stopped, and why, had it been enforced."""

    firing_id: Key
    rule: Name
    kind: Name
    scope: str = Field(
        description="the scope it would have stopped",
        max_length=MAX_SCOPE_CHARS,
        json_schema_extra={"pattern": SCOPE_PATTERN},
    )
    reason: Text
    fired_at: Time


async def record_firing(request: Request) -> Response:
    """Record a tripwire's would-be stop (shadow mode) in the audit log"""
    who = await caller(request, firings.RECORD, write=True)
    asked = await body(request, who, FiringBody, firings.RECORD)
    done = await firings.record(plane_of(request), who, firings.Firing(**asked.model_dump()))
    if done:
        request.app.state.metrics.tripwire_firings()
    answer: FiringRecorded = {"recorded": done}
    return JSONResponse(answer)


_ANSWER: tuple[Literal[200], type, str] = (
    200,
    FiringRecorded,
    "recorded as a stop.shadow audit record (false: its firing_id was recorded before)",
)

routes = [
    Route(
        "POST",
        "/v1/tripwire-firings",
        record_firing,
        firings.RECORD,
        _ANSWER,
        ((422, "invalid_request: a field is missing or out of bounds, or the scope does not parse"), 503),
        body=FiringBody,
    )
]
