"""The route of run reports: ``GET /v1/runs/{run_id}/report`` (read-only)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control import reports
from haltwire.control.routes.views import report_json
from haltwire.control.routes.wire import caller, plane_of


async def run_report(request: Request) -> Response:
    who = await caller(request, "run.report")
    report = await reports.report(plane_of(request), who, request.path_params["run_id"])
    return JSONResponse(report_json(report))


routes = [Route("/v1/runs/{run_id}/report", run_report, methods=["GET"])]
