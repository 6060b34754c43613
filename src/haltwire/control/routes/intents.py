"""Routes of intents: record (gateway), read and list, claim, check, commit, fail, unknown
(executor), approve and reject (operator)."""

from __future__ import annotations

from typing import Any, ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import intents
from haltwire.control.errors import invalid
from haltwire.control.routes.fields import Id, IdPath, Key, Name, Text
from haltwire.control.routes.views import IntentList, intent_json, intents_json
from haltwire.control.routes.wire import (
    ERRORS,
    Body,
    BodyLimit,
    Errors,
    Route,
    body,
    caller,
    limit_query,
    plane_of,
    query,
    query_id,
    query_limit,
)
from haltwire.intents import STATES, Intent
from haltwire.limits import ID_PATTERN, MAX_ITEMS


class IntentBody(Body):
    #: The arguments are a tool call's, as large as the gateway took them.
    body_limit: ClassVar[BodyLimit] = "max_intent_body_bytes"

    run_id: Id | None = None
    agent: Name
    tenant: Name
    version: Name
    tool: Name
    #: NaN and infinities are refused as the body is parsed (``wire.parse_body``).
    arguments: dict[str, Any]
    idempotency_key: Key
    needs_approval: bool = False


class CommitBody(Body):
    #: The tool's result, which nothing before bounds.
    body_limit: ClassVar[BodyLimit] = "max_intent_body_bytes"

    outcome: dict[str, Any]


class FailBody(Body):
    error: Text


class RejectBody(Body):
    reason: Text


async def create_intent(request: Request) -> Response:
    """Record an intent to call an irreversible tool (the executor performs it)"""
    who = await caller(request, "intent.create", write=True)
    asked = await body(request, who, IntentBody, "intent.create")
    intent, created = await intents.create(plane_of(request), who, **asked.model_dump())
    return JSONResponse(intent_json(intent), status_code=201 if created else 200)


async def get_intent(request: Request, intent_id: IdPath) -> Response:
    """One intent"""
    who = await caller(request, "intent.read")
    return JSONResponse(intent_json(await intents.readable(plane_of(request), who, intent_id)))


async def list_intents(request: Request) -> Response:
    """Intents, oldest first, of one run and/or in some states"""
    await caller(request, "intents.list")
    query = request.query_params
    limit = query_limit(request, most=MAX_ITEMS)
    # ?state=a&state=b or ?state=a,b: any of them.
    states = [s for given in query.getlist("state") for s in given.split(",") if s] or None
    if not set(states or ()) <= set(STATES):
        raise invalid(f"state: one or more of {', '.join(STATES)}")
    found = await plane_of(request).open.intents.list(
        run_id=query_id(request, "run"), states=states, limit=limit
    )
    return JSONResponse(intents_json(found))


async def claim_intent(request: Request) -> Response:
    """Claim the oldest pending intent for the calling executor"""
    who = await caller(request, "intent.claim", write=True)
    intent = await intents.claim(plane_of(request), who)
    return Response(status_code=204) if intent is None else JSONResponse(intent_json(intent))


async def commit_intent(request: Request, intent_id: IdPath) -> Response:
    """Record a claimed intent's outcome"""
    who = await caller(request, "intent.commit", intent_id, write=True)
    asked = await body(request, who, CommitBody, "intent.commit", intent_id)
    return JSONResponse(
        intent_json(await intents.decide(plane_of(request), who, "commit", intent_id, asked.outcome))
    )


async def fail_intent(request: Request, intent_id: IdPath) -> Response:
    """Record that a claimed intent's call failed"""
    who = await caller(request, "intent.fail", intent_id, write=True)
    asked = await body(request, who, FailBody, "intent.fail", intent_id)
    return JSONResponse(
        intent_json(await intents.decide(plane_of(request), who, "fail", intent_id, asked.error))
    )


async def approve_intent(request: Request, intent_id: IdPath) -> Response:
    """Approve an intent awaiting approval"""
    who = await caller(request, "intent.approve", intent_id, write=True)
    return JSONResponse(intent_json(await intents.decide(plane_of(request), who, "approve", intent_id)))


async def reject_intent(request: Request, intent_id: IdPath) -> Response:
    """Reject an intent awaiting approval"""
    who = await caller(request, "intent.reject", intent_id, write=True)
    asked = await body(request, who, RejectBody, "intent.reject", intent_id)
    return JSONResponse(
        intent_json(await intents.decide(plane_of(request), who, "reject", intent_id, asked.reason))
    )


async def mark_unknown(request: Request) -> Response:
    """After an executor's restart: every intent it had claimed becomes unknown"""
    who = await caller(request, "intent.unknown", write=True)
    return JSONResponse(intents_json(await intents.mark_unknown(plane_of(request), who)))


async def check_intent(request: Request, intent_id: IdPath) -> Response:
    """The executor's final registry check before it performs a claimed intent's call"""
    who = await caller(request, "intent.check", intent_id, write=True)
    return JSONResponse(intent_json(await intents.check(plane_of(request), who, intent_id)))


_UNKNOWN = (404, "unknown_intent: no intent has this id")
_TRANSITION = (
    409,
    "invalid_transition: the intent's state does not allow this, or another executor claimed it",
)
_ONE = (200, Intent, "the intent")


def _settle(path: str, endpoint: Any, action: str, body: type[Body] | None = None) -> Route:
    """A decision on one intent: its answer is the intent as decided."""
    errors: Errors = (_UNKNOWN, _TRANSITION, *((422,) if body else ()), 503)
    return Route("POST", path, endpoint, action, _ONE, errors, body=body)


routes = [
    Route(
        "POST",
        "/v1/intents",
        create_intent,
        "intent.create",
        (201, Intent, "the intent recorded (cancelled at once if a stop landed while it was recorded)"),
        (
            (
                409,
                "idempotency_conflict: the key was used for another tool or other arguments; "
                "or stopped: an active stop matches one of the intent's scopes (scope, stop_id "
                "and reason say which; nothing is recorded)",
            ),
            422,
            503,
        ),
        also=[(200, Intent, "a repeated idempotency key: the intent recorded first")],
        body=IntentBody,
    ),
    Route(
        "GET",
        "/v1/intents",
        list_intents,
        "intents.list",
        (200, IntentList, "the intents, oldest first"),
        (
            (422, f"invalid_request: limit not a number from 1 to {MAX_ITEMS}, an unknown state, a bad run"),
            503,
        ),
        query=[
            query("run", {"type": "string", "pattern": ID_PATTERN}, "only this run's intents"),
            query(
                "state",
                {"enum": list(STATES)},
                "only intents in this state (repeat it, or separate states by commas, for several)",
            ),
            limit_query(MAX_ITEMS, "intents"),
        ],
    ),
    Route(
        "POST",
        "/v1/intents/claim",
        claim_intent,
        "intent.claim",
        _ONE,
        (503,),
        also=[(204, None, "no intent is pending")],
    ),
    Route(
        "POST",
        "/v1/intents/unknown",
        mark_unknown,
        "intent.unknown",
        (200, IntentList, "the intents now unknown"),
        (503,),
    ),
    Route(
        "GET",
        "/v1/intents/{intent_id}",
        get_intent,
        "intent.read",
        _ONE,
        (
            (403, ERRORS[403] + ", or the intent is another agent's of the caller's tenant"),
            (404, f"{_UNKNOWN[1]} (or, to an agent, another tenant's)"),
            503,
        ),
    ),
    Route(
        "POST",
        "/v1/intents/{intent_id}/check",
        check_intent,
        "intent.check",
        (200, Intent, "no stop matches: checked_revision records the revision checked"),
        (
            _UNKNOWN,
            (
                409,
                "stopped: a stop matches the intent (or its run reached a per-run intent limit, "
                "which wrote one); the intent is now cancelled (error.intent); or invalid_transition",
            ),
            503,
        ),
    ),
    _settle("/v1/intents/{intent_id}/commit", commit_intent, "intent.commit", CommitBody),
    _settle("/v1/intents/{intent_id}/fail", fail_intent, "intent.fail", FailBody),
    _settle("/v1/intents/{intent_id}/approve", approve_intent, "intent.approve"),
    _settle("/v1/intents/{intent_id}/reject", reject_intent, "intent.reject", RejectBody),
]
