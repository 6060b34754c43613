"""The route of run reports: ``GET /v1/runs/{run_id}/report`` (read-only)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import reports
from haltwire.control.reports import RunReport
from haltwire.control.routes.runs import RunId
from haltwire.control.routes.views import report_json
from haltwire.control.routes.wire import FORBIDDEN_RUN, UNKNOWN_RUN, Route, caller, plane_of


async def run_report(request: Request, run_id: RunId) -> Response:
    """What a run did: its intents by state, the stops that hit it and its audit timeline"""
    who = await caller(request, "run.report")
    report = await reports.report(plane_of(request), who, run_id)
    return JSONResponse(report_json(report))


routes = [
    Route(
        "GET",
        "/v1/runs/{run_id}/report",
        run_report,
        "run.report",
        (200, RunReport, "the report"),
        (FORBIDDEN_RUN, UNKNOWN_RUN, 503),
    )
]
