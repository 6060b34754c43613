"""Routes of the stop registry: issue, clear and list stops, read and verify the audit log, the watch.

Issuing and clearing take an ``Idempotency-Key`` header: a repeat with the same key answers
what the first request wrote (``Idempotent-Replayed: true``) and writes nothing.

The watch stream is server-sent events of registry changes after a revision (``?since=N`` or
``Last-Event-ID``), then ``: caught-up`` once every missed change is sent, then each change as
it is written, with a ``: heartbeat`` comment every ``heartbeat_s`` when idle. An
``audit-head`` event (``{"seq", "hash"}``) publishes the audit log's head when it moves, so a
follower can hold it outside the database (``GET /v1/audit/verify?expect_head=SEQ:HASH``).
A replay is written a page per write; a watcher that hangs up ends it before the next page.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, Final, get_args

import anyio
import anyio.lowlevel
from pydantic import Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from haltwire.control import audit, stops
from haltwire.control.errors import Refused, invalid
from haltwire.control.plane import MAX_AUDIT_TEXT, Plane
from haltwire.control.routes.fields import IdPath, Name, Text
from haltwire.control.routes.views import (
    AuditHead,
    AuditList,
    Health,
    StopList,
    Whoami,
    change_json,
    stop_json,
    whoami_json,
)
from haltwire.control.routes.wire import JSON, REF, Body, Route, body, caller, plane_of, query
from haltwire.limits import MAX_SCOPE_CHARS, PRINTABLE_PATTERN, has_control_characters
from haltwire.scope import KINDS
from haltwire.sse import CAUGHT_UP
from haltwire.stops import Change, ChangeKind, StopRecord
from haltwire.store.audit import Head, VerifyResult
from haltwire.store.registry import RegistryUnavailable

#: ``Scope.parse``'s grammar (scope.py), so generated bodies mostly name real scopes. For the
#: document only: the rule refuses a bad scope with its own words.
SCOPE_PATTERN: Final = (
    rf"^(global|({'|'.join(k for k in KINDS if k not in ('global', 'version'))}):\S(.*\S)?"
    r"|version:[^@\s][^@]*@.*\S)$"
)


class IssueBody(Body):
    scope: str = Field(
        description="run:ID, tenant:ID, tool:NAME, agent:ID, version:AGENT@VERSION or global",
        max_length=MAX_SCOPE_CHARS,
        json_schema_extra={"pattern": SCOPE_PATTERN},
    )
    reason: Text
    expires_at: float | None = Field(default=None, allow_inf_nan=False)  # inf made every stops list a 500
    rule: Name | None = Field(
        default=None,
        description="the rule that fired (role tripwire only): in the stop's audit record and its page",
    )


class ClearBody(Body):
    reason: Text


#: The longest ``Idempotency-Key`` (as Stripe's): a UUID is 36 characters.
MAX_REQUEST_KEY: Final = 255


def _request_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_REQUEST_KEY or not key.isprintable() or not key.isascii():
        raise invalid(f"Idempotency-Key: 1 to {MAX_REQUEST_KEY} printable ASCII characters")
    return key


async def _stop_json(plane: Plane, stop: StopRecord) -> dict[str, Any]:
    """The stop, saying whether it is a drill's (``haltwire.control.drills``)."""
    return stop_json(stop) | {"drill": await plane.drills.of_stop(stop, plane.run_tenant)}


async def _written(plane: Plane, written: stops.Written, status: int) -> Response:
    headers = {"Idempotent-Replayed": "true"} if written.replayed else None
    return JSONResponse(await _stop_json(plane, written.stop), status_code=status, headers=headers)


async def issue_stop(request: Request) -> Response:
    """Issue a stop"""
    plane = plane_of(request)
    who = await caller(request, "stop.issue", write=True)
    asked = await body(request, who, IssueBody, "stop.issue")
    key = _request_key(request)
    written = await stops.issue(plane, who, asked.scope, asked.reason, asked.expires_at, key, rule=asked.rule)
    return await _written(plane, written, 201)


async def clear_stop(request: Request, stop_id: IdPath) -> Response:
    """Clear a stop"""
    plane = plane_of(request)
    who = await caller(request, "stop.clear", stop_id, write=True)
    asked = await body(request, who, ClearBody, "stop.clear", stop_id)
    return await _written(plane, await stops.clear(plane, who, stop_id, asked.reason, _request_key(request)), 200)


async def list_stops(request: Request) -> Response:
    """Active stops (all stops ever with all=1), as visible to the caller"""
    who = await caller(request, "stops.read")
    every = request.query_params.get("all") in ("1", "true", "yes")
    plane = plane_of(request)
    return JSONResponse({"stops": [await _stop_json(plane, s) for s in await stops.listed(plane, who, every)]})


async def list_audit(request: Request) -> Response:
    """The audit log, oldest first"""
    await caller(request, "audit.read")
    target = request.query_params.get("target")
    # What a record's target can be: the log keeps at most MAX_AUDIT_TEXT characters of one.
    if target is not None and (len(target) > MAX_AUDIT_TEXT or has_control_characters(target)):
        raise invalid(f"target: at most {MAX_AUDIT_TEXT} characters, no control characters")
    records = await plane_of(request).open.audit.records(target=target)
    return JSONResponse({"records": [asdict(r) for r in records]})


async def verify_audit(request: Request) -> Response:
    """Check the audit log's keyed hash chain, the registry against it, and a head held before"""
    await caller(request, "audit.read")
    text = request.query_params.get("expect_head")
    try:
        expect = None if text is None else Head.parse(text)
    except ValueError as exc:
        raise invalid(f"expect_head: {exc}") from None
    return JSONResponse(asdict(await audit.verify(plane_of(request), expect)))


async def audit_head(request: Request) -> Response:
    """The audit log's head: its newest record's seq and hash"""
    await caller(request, "audit.read")
    head = await audit.head(plane_of(request))
    return JSONResponse({"seq": head.seq, "hash": head.hash, "head": str(head)})


def _revision(text: str | None, name: str) -> int:
    text = text or "0"
    # Below 2**63: past any store's revision column (64-bit), it made SQLite raise, a 500.
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) < 2**63):
        raise invalid(f"{name}: a revision number, from 0 to 2**63 - 1")
    return int(text)


async def watch(request: Request) -> Response:
    """Watch registry changes after a revision"""
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

    gone = anyio.Event()

    async def hung_up(message: Message) -> None:
        gone.set()

    async def events() -> AsyncIterator[bytes]:
        after, (changes, last), replayed = since, first, False
        head: Head | None = None
        while not gone.is_set():
            read_any = last > after  # the page read was not empty (some may be hidden from us)
            out = [
                ServerSentEvent(
                    json.dumps(change_json(c), separators=(",", ":")), event=c.kind, id=str(c.revision)
                ).encode()
                for c in changes
            ]
            changed = plane.changed  # taken before the read: a write after it wakes us
            if not read_any and not replayed:
                # Every missed change is sent: only from here may a watcher count itself current.
                replayed = True
                out.append(ServerSentEvent(comment=CAUGHT_UP, sep="\n").encode())
            if replayed and plane.audit_head is not None and plane.audit_head != head:
                head = plane.audit_head
                out.append(ServerSentEvent(json.dumps({"seq": head.seq, "hash": head.hash}), event="audit-head").encode())
            if out:
                # One write per page, then the page read gives the event loop a turn: a client
                # that hung up is known before the next write. A page's events written one by
                # one went on after the first write failed, each logging "socket.send() raised".
                yield b"".join(out)
            if not read_any:
                # Woken by a write (ours, or another replica's via the registry's
                # follow_writes), else re-read once a heartbeat period as a fallback.
                with anyio.move_on_after(plane.heartbeat_s):
                    await changed.wait()
            after = last
            try:
                # Shielded: a hang-up ends the stream between pages, never a read mid-query (on
                # PostgreSQL a query cut short closes the read connection every request shares).
                with anyio.CancelScope(shield=True):
                    changes, last = await stops.changes_after(plane, who, after)
            except RegistryUnavailable as exc:
                yield ServerSentEvent(json.dumps({"error": str(exc)}), event="error").encode()
                return
            await anyio.lowlevel.checkpoint_if_cancelled()  # the hang-up's cancellation, if any

    return EventSourceResponse(
        events(),
        ping=plane.heartbeat_s,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat", sep="\n"),
        headers={"Cache-Control": "no-store"},
        client_close_handler_callable=hung_up,
    )


async def whoami(request: Request) -> Response:
    """Who the bearer token is, and whether it is sent every stop (enforcement points ask at start-up)"""
    return JSONResponse(whoami_json(await caller(request, "whoami")))


async def healthz(request: Request) -> Response:
    """Liveness and the registry's revision"""
    try:
        revision = await plane_of(request).open.registry.revision()
    except RegistryUnavailable as exc:
        raise Refused(503, "registry_unavailable", str(exc)) from None
    return JSONResponse({"ok": True, "revision": revision})


def _watch_events() -> dict[str, Any]:
    """One server-sent event: a registry change, or an ``error`` event before the stream ends."""

    def event(kind: dict[str, Any], data: dict[str, Any], with_id: bool) -> dict[str, Any]:
        properties = {
            "event": kind,
            "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
        }
        if with_id:
            properties["id"] = {"type": "string", "pattern": "^[0-9]+$"}
        return {"type": "object", "properties": properties, "required": list(properties)}

    change = event({"enum": list(get_args(ChangeKind))}, {"$ref": REF.format(model="Change")}, True)
    failure = event(
        {"const": "error"},
        {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
        False,
    )
    head = event(
        {"const": "audit-head"},
        {"type": "object", "properties": {"seq": {"type": "integer"}, "hash": {"type": "string"}}},
        False,
    )
    return {"text/event-stream": {"schema": {"oneOf": [change, failure, head]}}}


_KEY_HEADER = query(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": MAX_REQUEST_KEY},
    "makes the request safe to repeat: a repeat with the same key answers what the first wrote",
    "header",
)
_EXPECT = "SEQ:HASH as `GET /v1/audit/head` gave it: the log must still hold that record with that hash"

#: A stop just issued can be cleared: schemathesis' stateful phase follows this link.
_CLEAR_LINK = {"clear": {"operationId": "clear_stop", "parameters": {"stop_id": "$response.body#/stop_id"}}}
_REVISION = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}  # the stores' 64-bit column
_EVENTS = (
    "Server-sent events: each registry change after the revision (the event id is its revision), "
    "with heartbeat comments; an `error` event ends the stream if the registry fails"
)

routes = [
    Route("GET", "/healthz", healthz, None, (200, Health, "ok"), (503,)),
    Route(
        "POST",
        "/v1/stops",
        issue_stop,
        "stop.issue",
        (201, StopRecord, "the stop issued (or, Idempotent-Replayed, the one its key issued before)"),
        ((409, "idempotency_conflict: the Idempotency-Key was used before for another request"), 422, 503),
        body=IssueBody,
        query=[_KEY_HEADER],
        links=_CLEAR_LINK,
    ),
    Route(
        "GET",
        "/v1/stops",
        list_stops,
        "stops.read",
        (200, StopList, "the stops"),
        (503,),
        query=[query("all", {"type": "string"}, "1, true or yes: every stop, cleared and expired too")],
    ),
    Route(
        "POST",
        "/v1/stops/{stop_id}/clear",
        clear_stop,
        "stop.clear",
        (200, StopRecord, "the stop as cleared"),
        (
            (404, "unknown_stop: no stop has this id"),
            (
                409,
                "already_cleared: the stop was cleared before; idempotency_conflict: the key was used for another request",
            ),
            422,
            503,
        ),
        body=ClearBody,
        query=[_KEY_HEADER],
    ),
    Route(
        "GET",
        "/v1/audit",
        list_audit,
        "audit.read",
        (200, AuditList, "the records"),
        (422, 503),
        query=[
            query(
                "target",
                {"type": "string", "maxLength": MAX_AUDIT_TEXT, "pattern": PRINTABLE_PATTERN},
                "only records about this target (a stop id, a scope)",
            )
        ],
    ),
    Route(
        "GET",
        "/v1/audit/verify",
        verify_audit,
        "audit.read",
        (200, VerifyResult, "the result"),
        (422, 503),
        query=[query("expect_head", {"type": "string", "pattern": "^[0-9]{1,19}:[0-9a-f]{64}$"}, _EXPECT)],
    ),
    Route("GET", "/v1/audit/head", audit_head, "audit.read", (200, AuditHead, "the head"), (503,)),
    Route("GET", "/v1/whoami", whoami, "whoami", (200, Whoami, "the caller")),
    Route(
        "GET",
        "/v1/watch",
        watch,
        "watch",
        (200, _watch_events(), _EVENTS),
        (422, 503),
        query=[
            query("since", _REVISION, "the last revision seen (default 0: from the start)"),
            query("Last-Event-ID", _REVISION, "a reconnecting client's last event id", "header"),
        ],
        refers=(Change,),
    ),
]
