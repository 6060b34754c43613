"""Routes of intents: record (gateway), read and list, claim, check, commit, fail, unknown
(executor), approve and reject (operator)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control import intents
from haltwire.control.errors import invalid
from haltwire.control.intents import Decision
from haltwire.control.routes.runs import MAX_BATCH, RUN_ID
from haltwire.control.routes.views import intent_json, intents_json
from haltwire.control.routes.wire import Body, body, caller, plane_of, query_limit
from haltwire.intents import STATES


def _strict_json(value: Any, what: str) -> Any:
    # Python's JSON reads NaN and 1e400 (infinity); no JSON response may carry them back.
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(f"{what} may not hold NaN or infinite numbers") from None
    return value


class IntentBody(Body):
    run_id: str | None = Field(default=None, pattern=RUN_ID)
    agent: str = Field(min_length=1, max_length=256)
    tenant: str = Field(min_length=1, max_length=256)
    version: str = Field(min_length=1, max_length=256)
    tool: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any]
    idempotency_key: str = Field(min_length=1, max_length=256)
    needs_approval: bool = False

    @field_validator("arguments")
    @classmethod
    def _json_arguments(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        return dict(_strict_json(arguments, "arguments"))


class CommitBody(Body):
    outcome: dict[str, Any]

    @field_validator("outcome")
    @classmethod
    def _json_outcome(cls, outcome: dict[str, Any]) -> dict[str, Any]:
        return dict(_strict_json(outcome, "an outcome"))


class FailBody(Body):
    error: str = Field(min_length=1)


class RejectBody(Body):
    reason: str = Field(min_length=1, pattern=r"\S")


async def create_intent(request: Request) -> Response:
    who = await caller(request, "intent.create", write=True)
    asked = await body(request, who, IntentBody, "intent.create")
    intent, created = await intents.create(plane_of(request), who, **asked.model_dump())
    return JSONResponse(intent_json(intent), status_code=201 if created else 200)


async def get_intent(request: Request) -> Response:
    who = await caller(request, "intent.read")
    return JSONResponse(intent_json(await intents.readable(plane_of(request), who, request.path_params["intent_id"])))


async def list_intents(request: Request) -> Response:
    await caller(request, "intents.list")
    query = request.query_params
    limit = query_limit(request, most=MAX_BATCH)
    # ?state=a&state=b or ?state=a,b: any of them.
    states = [s for given in query.getlist("state") for s in given.split(",") if s] or None
    unknown = sorted(set(states or ()) - set(STATES))
    if unknown:
        raise invalid(f"not intent states: {', '.join(unknown)}")
    found = await plane_of(request).open.intents.list(run_id=query.get("run") or None, states=states, limit=limit)
    return JSONResponse(intents_json(found))


async def claim_intent(request: Request) -> Response:
    who = await caller(request, "intent.claim", write=True)
    intent = await intents.claim(plane_of(request), who)
    return Response(status_code=204) if intent is None else JSONResponse(intent_json(intent))


async def _decide(request: Request, action: Decision, model: type[Body] | None, said: str = "") -> Response:
    """commit, fail, approve, reject: ``said`` names the body field the rule takes."""
    intent_id = request.path_params["intent_id"]
    who = await caller(request, f"intent.{action}", intent_id, write=True)
    asked = None if model is None else await body(request, who, model, f"intent.{action}", intent_id)
    intent = await intents.decide(plane_of(request), who, action, intent_id, getattr(asked, said, None))
    return JSONResponse(intent_json(intent))


async def commit_intent(request: Request) -> Response:
    return await _decide(request, "commit", CommitBody, "outcome")


async def fail_intent(request: Request) -> Response:
    return await _decide(request, "fail", FailBody, "error")


async def approve_intent(request: Request) -> Response:
    return await _decide(request, "approve", None)


async def reject_intent(request: Request) -> Response:
    return await _decide(request, "reject", RejectBody, "reason")


async def mark_unknown(request: Request) -> Response:
    who = await caller(request, "intent.unknown", write=True)
    return JSONResponse(intents_json(await intents.mark_unknown(plane_of(request), who)))


async def check_intent(request: Request) -> Response:
    intent_id = request.path_params["intent_id"]
    who = await caller(request, "intent.check", intent_id, write=True)
    return JSONResponse(intent_json(await intents.check(plane_of(request), who, intent_id)))


routes = [
    Route("/v1/intents", create_intent, methods=["POST"]),
    Route("/v1/intents", list_intents, methods=["GET"]),
    Route("/v1/intents/claim", claim_intent, methods=["POST"]),
    Route("/v1/intents/unknown", mark_unknown, methods=["POST"]),
    Route("/v1/intents/{intent_id}", get_intent, methods=["GET"]),
    Route("/v1/intents/{intent_id}/check", check_intent, methods=["POST"]),
    Route("/v1/intents/{intent_id}/commit", commit_intent, methods=["POST"]),
    Route("/v1/intents/{intent_id}/fail", fail_intent, methods=["POST"]),
    Route("/v1/intents/{intent_id}/approve", approve_intent, methods=["POST"]),
    Route("/v1/intents/{intent_id}/reject", reject_intent, methods=["POST"]),
]
