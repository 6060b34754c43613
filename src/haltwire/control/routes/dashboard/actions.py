"""The dashboard's writes: sign in and out, issue and clear stops, approve and reject intents.

Each write, after ``signed_in`` and ``check_csrf``: the role is authorized for the API's action
(a refusal is audited, as the API's), then the same rule the API's route calls writes it and
its audit record as the signed-in identity. The answer is a redirect to the overview, with
what was done shown once (``Session.flash``), or a page saying in words why not.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from haltwire.control import intents, stops
from haltwire.control.access import authorize
from haltwire.control.errors import Refused, invalid
from haltwire.control.routes.dashboard.render import page
from haltwire.control.routes.dashboard.sessions import (
    COOKIE,
    PEOPLE,
    check_csrf,
    clear_cookie,
    require_admin_listener,
    sessions_of,
    set_cookie,
    signed_in,
)
from haltwire.control.routes.dashboard.web import back_home, checked_id, guarded, read_form
from haltwire.control.routes.stops import MAX_REQUEST_KEY
from haltwire.control.routes.wire import plane_of
from haltwire.identity import token_sha256


@guarded
async def sign_in(request: Request) -> Response:
    """Exchange an operator's or a viewer's bearer token for a session cookie.

    Order: the admin listener; an ``Origin`` sent is this dashboard's; the token is known and
    current; its role is a person's (operator or viewer)."""
    require_admin_listener(request)
    plane = plane_of(request)
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        return page("sign_in.html", 403, problem=f"a sign-in from another site ({origin}) is refused")
    token = (await read_form(request)).get("token", "").strip()
    digest = token_sha256(token)
    caller = plane.callers.get(digest)
    sessions = sessions_of(request)
    if not token or caller is None or caller.expired(sessions.clock()):
        # Not audited, as the API's unknown tokens: an unknown caller cannot flood the log.
        return page("sign_in.html", 401, problem="that token is not a current token of this control plane")
    if caller.role not in PEOPLE:
        said = f"a {caller.role} token cannot sign in to the dashboard: use an operator's or a viewer's"
        return page("sign_in.html", 403, problem=said)
    session_id, session = sessions.open(digest, caller)
    await plane.audit(caller, "dashboard.sign_in", caller.name, "ok", "signed in to the dashboard")
    response = back_home()
    set_cookie(response, request, session_id, session, sessions.clock())
    return response


@guarded
async def sign_out(request: Request) -> Response:
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    check_csrf(request, session, await read_form(request))
    sessions_of(request).close(request.cookies.get(COOKIE))
    await plane.audit(caller, "dashboard.sign_out", caller.name, "ok", "signed out of the dashboard")
    response = page("sign_in.html", problem=None)
    clear_cookie(response, request)
    return response


def _key(form: dict[str, str]) -> str | None:
    key = form.get("key") or None
    if key is not None and not (len(key) <= MAX_REQUEST_KEY and key.isascii() and key.isprintable()):
        raise invalid(f"key: 1 to {MAX_REQUEST_KEY} printable ASCII characters")
    return key


@guarded
async def issue_stop(request: Request) -> Response:
    """Issue the stop the review page showed (``stops.issue``, as ``POST /v1/stops``)."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    form = await read_form(request)
    check_csrf(request, session, form)
    scope, reason = form.get("scope", ""), form.get("reason", "")
    await authorize(plane, caller, "stop.issue", scope, write=True)
    written = await stops.issue(plane, caller, scope, reason, request_key=_key(form))
    said = f"Stopped {written.stop.scope} (stop {written.stop.stop_id}): {written.stop.reason}"
    if written.replayed:
        said = f"Already stopped by this form: {written.stop.scope} (stop {written.stop.stop_id})"
    for wider in written.escalated:
        said += f"; escalated to {wider.scope} (stop {wider.stop_id})"
    session.flash.append(said)
    return back_home()


@guarded
async def clear_stop(request: Request, stop_id: str) -> Response:
    """Clear a stop with a reason (``stops.clear``, as ``POST /v1/stops/{id}/clear``)."""
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    form = await read_form(request)
    check_csrf(request, session, form)
    await authorize(plane, caller, "stop.clear", stop_id, write=True)
    cleared = await stops.clear(plane, caller, checked_id("stop_id", stop_id), form.get("reason", ""))
    session.flash.append(f"Cleared {cleared.stop.scope} (stop {cleared.stop.stop_id}): {cleared.stop.clear_reason}")
    return back_home()


async def _decide(request: Request, intent_id: str, action: intents.Decision) -> Response:
    plane = plane_of(request)
    caller, session = signed_in(request, plane)
    form = await read_form(request)
    check_csrf(request, session, form)
    await authorize(plane, caller, f"intent.{action}", intent_id, write=True)
    reason = form.get("reason", "").strip() if action == "reject" else None
    if action == "reject" and not reason:
        raise await plane.refuse(caller, "intent.reject", intent_id, invalid("a rejection needs a reason"))
    try:
        intent = await intents.decide(plane, caller, action, checked_id("intent_id", intent_id), reason)
    except Refused as exc:
        exc.message = f"intent {intent_id} was not {action}d: {exc.message}"
        raise
    done = "approved: the executor performs it next" if action == "approve" else f"rejected: {reason}"
    session.flash.append(f"Intent {intent.intent_id} ({intent.tool}) {done}")
    return back_home()


@guarded
async def approve_intent(request: Request, intent_id: str) -> Response:
    return await _decide(request, intent_id, "approve")


@guarded
async def reject_intent(request: Request, intent_id: str) -> Response:
    return await _decide(request, intent_id, "reject")

