"""The route of a stop's blast radius: ``GET /v1/blast-radius?scope=SCOPE`` (read-only), what
the dashboard's review shows before a stop is pressed (``haltwire.control.blast``)."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import blast
from haltwire.control.errors import invalid
from haltwire.control.routes.stops import SCOPE_PATTERN
from haltwire.control.routes.wire import Route, caller, plane_of, query
from haltwire.limits import MAX_SCOPE_CHARS


async def blast_radius(request: Request) -> Response:
    """What a stop on a scope would reach now: the live runs, their tenants, agents and versions"""
    who = await caller(request, "runs.list")
    scope = request.query_params.get("scope")
    if scope is None:
        raise invalid("scope: the scope a stop would name (run:ID, tenant:ID, agent:ID, ..., or global)")
    return JSONResponse(asdict(await blast.radius(plane_of(request), who, scope)))


routes = [
    Route(
        "GET",
        "/v1/blast-radius",
        blast_radius,
        "runs.list",
        (200, blast.BlastRadius, "the live runs a stop on the scope would reach"),
        ((422, "invalid_request: no scope, or one that does not parse"), 503),
        query=[
            query(
                "scope",
                {"type": "string", "maxLength": MAX_SCOPE_CHARS, "pattern": SCOPE_PATTERN},
                "the scope a stop would name",
            )
        ],
    )
]
