"""The dashboard's pages (reads only): the overview, a stop's review with its blast radius, a
run's report, the audit log with its verification. Each reads through the rule the API's
route calls (``stops``, ``blast``, ``reports``, ``recent``, ``audit``)."""

from __future__ import annotations

import secrets
import time

from starlette.requests import Request
from starlette.responses import Response

from haltwire.control import audit, blast, recent, reports
from haltwire.control.access import authorize
from haltwire.control.errors import invalid
from haltwire.control.routes.dashboard import panels
from haltwire.control.routes.dashboard.render import page, static
from haltwire.control.routes.dashboard.sessions import require_admin_listener, signed_in
from haltwire.control.routes.dashboard.web import checked_id, guarded, may
from haltwire.control.routes.wire import plane_of
from haltwire.scope import KINDS


def scope_of(kind: str, value: str) -> str:
    """The scope text a stop form names: ``global``, or ``KIND:VALUE``."""
    if kind not in KINDS:
        raise invalid(f"kind: one of {', '.join(KINDS)}")
    if kind == "global":
        return "global"
    if not value.strip():
        raise invalid(f"say which {kind} to stop")
    return f"{kind}:{value.strip()}"


@guarded
async def overview(request: Request) -> Response:
    """Active stops, live runs, intents awaiting approval, recent refusals and firings."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    board: panels.Board = request.app.state.dashboard_board
    html = await board.look(plane, caller, session, time.monotonic())
    flash, session.flash = session.flash, []
    kind = request.query_params.get("kind", "agent")
    return page(
        "overview.html",
        caller=caller,
        csrf=session.csrf,
        may=may(caller),
        flash=flash,
        panels=html,
        kinds=KINDS,
        prefill_kind=kind if kind in KINDS else "agent",
        prefill_value=request.query_params.get("value", ""),
    )


@guarded
async def review_stop(request: Request) -> Response:
    """What a stop would reach, before anything is written; the button that writes it.

    Order: signed in; the role may issue stops (a viewer is refused here, and again at the
    write); a reason is given; the scope parses (``blast.radius``)."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    await authorize(plane, caller, "stop.issue")
    query = request.query_params
    reason = query.get("reason", "").strip()
    if not reason:
        raise invalid("a stop needs a reason: say why, for whoever clears it")
    radius = await blast.radius(plane, caller, scope_of(query.get("kind", ""), query.get("value", "")))
    return page(
        "review.html",
        caller=caller,
        csrf=session.csrf,
        radius=radius,
        reason=reason,
        # The write's Idempotency-Key: pressing twice, or resending the form, stops once.
        key=secrets.token_urlsafe(16),
    )


@guarded
async def run_page(request: Request, run_id: str) -> Response:
    """A run's report: completed, unknown, cancelled, the stops that hit it, its timeline."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    await authorize(plane, caller, "run.report")
    report = await reports.report(plane, caller, checked_id("run_id", run_id))
    return page("report.html", caller=caller, csrf=session.csrf, may=may(caller), report=report)


@guarded
async def audit_page(request: Request) -> Response:
    """The newest audit records and the result of verifying the whole log."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    newest = await recent.recent(plane, caller, 200)  # authorizes audit.read
    verified = await audit.verify(plane)
    return page(
        "audit.html", caller=caller, csrf=session.csrf, records=newest.records, verified=verified
    )


@guarded
async def static_file(request: Request, name: str) -> Response:
    require_admin_listener(request)
    return static(name)
