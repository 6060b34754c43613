"""Routes of the stop registry: issue, clear and list stops, read and verify the audit log, the watch.

The watch stream is server-sent events of registry changes after a revision (``?since=N`` or
``Last-Event-ID``), then ``: caught-up`` once every missed change is sent, then each change as
it is written, with a ``: heartbeat`` comment every ``heartbeat_s`` when idle.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict

import anyio
from pydantic import Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control import stops
from haltwire.control.errors import Refused, invalid
from haltwire.control.routes.views import change_json, stop_json
from haltwire.control.routes.wire import Body, body, caller, plane_of
from haltwire.sse import CAUGHT_UP
from haltwire.store.audit import verify
from haltwire.store.registry import RegistryUnavailable


class IssueBody(Body):
    scope: str
    reason: str = Field(min_length=1)
    expires_at: float | None = Field(default=None, allow_inf_nan=False)  # inf made every stops list a 500


class ClearBody(Body):
    reason: str = Field(min_length=1)


async def issue_stop(request: Request) -> Response:
    plane = plane_of(request)
    who = await caller(request, "stop.issue", write=True)
    asked = await body(request, who, IssueBody, "stop.issue")
    stop = await stops.issue(plane, who, asked.scope, asked.reason, asked.expires_at)
    return JSONResponse(stop_json(stop), status_code=201)


async def clear_stop(request: Request) -> Response:
    plane = plane_of(request)
    stop_id = request.path_params["stop_id"]
    who = await caller(request, "stop.clear", stop_id, write=True)
    asked = await body(request, who, ClearBody, "stop.clear", stop_id)
    return JSONResponse(stop_json(await stops.clear(plane, who, stop_id, asked.reason)))


async def list_stops(request: Request) -> Response:
    who = await caller(request, "stops.read")
    every = request.query_params.get("all") in ("1", "true", "yes")
    return JSONResponse({"stops": [stop_json(s) for s in await stops.listed(plane_of(request), who, every)]})


async def list_audit(request: Request) -> Response:
    await caller(request, "audit.read")
    records = await plane_of(request).open.audit.records(target=request.query_params.get("target"))
    return JSONResponse({"records": [asdict(r) for r in records]})


async def verify_audit(request: Request) -> Response:
    await caller(request, "audit.read")
    return JSONResponse(asdict(verify(await plane_of(request).open.audit.records())))


def _revision(text: str | None, name: str) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        raise invalid(f"{name} must be a revision number, not {text!r}") from None
    if value < 0:
        raise invalid(f"{name} must not be negative")
    if value >= 2**63:  # past any store's revision column (64-bit): it made SQLite raise, a 500
        raise invalid(f"{name} must be below 2**63")
    return value


async def watch(request: Request) -> Response:
    plane = plane_of(request)
    who = await caller(request, "watch")
    last_id = request.headers.get("last-event-id")
    since = (
        _revision(last_id, "Last-Event-ID")
        if last_id is not None
        else _revision(request.query_params.get("since"), "since")
    )
    # A failing store answers 503 before streaming.
    first = await stops.changes_after(plane, who, since)

    async def events() -> AsyncIterator[ServerSentEvent]:
        after, (changes, last), replayed = since, first, False
        while True:
            read_any = last > after  # the page read was not empty (some may be hidden from us)
            for c in changes:
                yield ServerSentEvent(
                    json.dumps(change_json(c), separators=(",", ":")), event=c.kind, id=str(c.revision)
                )
            changed = plane.changed  # taken before the read: a write after it wakes us
            if not read_any and not replayed:
                # Every missed change is sent: only from here may a watcher count itself current.
                replayed = True
                yield ServerSentEvent(comment=CAUGHT_UP, sep="\n")
            if not read_any:
                # Woken by a write (ours, or another replica's via the registry's
                # follow_writes), else re-read once a heartbeat period as a fallback.
                with anyio.move_on_after(plane.heartbeat_s):
                    await changed.wait()
            after = last
            try:
                changes, last = await stops.changes_after(plane, who, after)
            except RegistryUnavailable as exc:
                yield ServerSentEvent(json.dumps({"error": str(exc)}), event="error")
                return

    return EventSourceResponse(
        events(),
        ping=plane.heartbeat_s,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat", sep="\n"),
        headers={"Cache-Control": "no-store"},
    )


async def healthz(request: Request) -> Response:
    try:
        revision = await plane_of(request).open.registry.revision()
    except RegistryUnavailable as exc:
        raise Refused(503, "registry_unavailable", str(exc)) from None
    return JSONResponse({"ok": True, "revision": revision})


routes = [
    Route("/healthz", healthz),
    Route("/v1/stops", issue_stop, methods=["POST"]),
    Route("/v1/stops", list_stops, methods=["GET"]),
    Route("/v1/stops/{stop_id}/clear", clear_stop, methods=["POST"]),
    Route("/v1/audit", list_audit),
    Route("/v1/audit/verify", verify_audit),
    Route("/v1/watch", watch),
]
