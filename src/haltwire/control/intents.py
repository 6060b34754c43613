"""The control plane's intent endpoints: record, read, claim, commit, fail, approve, reject.

The gateway records an intent for a call to an irreversible tool (``POST /v1/intents``) instead
of calling it; the executor claims intents one at a time, asks for the final registry check
before each call (``check``), commits or fails each one it claimed, and after a restart marks
what it had claimed ``unknown`` (it then re-issues those calls with their idempotency keys).
Operators approve or reject intents that wait for it. The states and who moves them are
``haltwire.store.intents``.

Stops: a new intent is refused (409 ``stopped``, nothing recorded) when an active stop already
matches one of its scopes, and every stop issued through this control plane cancels the
intents its scope covers whose call was not made (pending, awaiting approval, claimed but not
checked) before ``POST /v1/stops`` answers (``cancel_for_stop``). A stop landing between the
check and the insert is caught by checking again after the insert. Every write is audited,
refused ones too, as in ``runs``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any, Final

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# app.py imports this module for its routes: use its names at call time, not import time.
from haltwire.control import app as http
from haltwire.control.config import Caller
from haltwire.control.runs import MAX_BATCH, RUN_ID
from haltwire.control.wire import Body, Refused, parse_body, query_limit
from haltwire.refusal import stopped
from haltwire.scope import Scope
from haltwire.stops import StopRecord
from haltwire.store.intents import (
    STATES,
    IdempotencyConflict,
    Intent,
    IntentStateError,
    LimitReached,
    UnknownIntent,
    new_intent,
    oldest_first,
)
from haltwire.store.registry import RegistryUnavailable

log = logging.getLogger("haltwire.intents")


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


def intent_json(intent: Intent) -> dict[str, Any]:
    return asdict(intent)


def intents_json(intents: list[Intent]) -> dict[str, Any]:
    return {"intents": [intent_json(i) for i in intents]}


def _unknown(intent_id: str) -> Refused:
    return Refused(404, "unknown_intent", f"no intent has the id {intent_id}")


async def _refuse(
    plane: http.Plane, caller: Caller, action: str, target: str, exc: Refused, **detail: Any
) -> Refused:
    await plane.audit(caller, action, target, "refused", exc.message, code=exc.code, **detail)
    return exc


def _stop_on(plane: http.Plane, intent: Intent) -> tuple[Scope, StopRecord] | None:
    stops = plane.mirror.stops
    if not len(stops):  # the common case: no active stop anywhere, no scopes to build
        return None
    return stops.match(intent.scopes, time.time())


def _stopped(hit: tuple[Scope, StopRecord]) -> Refused:
    scope, stop = hit
    error = stopped(str(scope), stop.stop_id, stop.reason).error()
    extra = {k: v for k, v in error.items() if k in ("scope", "stop_id", "reason")}
    return Refused(409, "stopped", str(error["message"]), **extra)


async def create_intent(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "intent.create", write=True)
    try:
        body: IntentBody = await parse_body(request, IntentBody)
    except Refused as exc:
        raise await _refuse(plane, caller, "intent.create", "", exc) from None
    store = plane.open.intents
    try:
        new = new_intent(now=time.time(), **body.model_dump())
    except ValueError as exc:
        invalid = Refused(422, "invalid_request", str(exc))
        raise await _refuse(
            plane, caller, "intent.create", body.idempotency_key, invalid, run_id=body.run_id
        ) from None
    await plane.mirror.catch_up(plane.open.registry)
    hit = _stop_on(plane, new)
    if hit is not None:
        # A repeat of a call recorded before the stop still answers what was recorded.
        earlier = await store.by_key(body.agent, body.idempotency_key)
        if earlier is None:
            # With its run, so the run's report shows the call the stop refused.
            raise await _refuse(
                plane, caller, "intent.create", body.idempotency_key, _stopped(hit), run_id=body.run_id
            )
    try:
        intent, created = await store.create(new)
    except IdempotencyConflict as exc:
        conflict = Refused(409, "idempotency_conflict", str(exc))
        raise await _refuse(
            plane, caller, "intent.create", body.idempotency_key, conflict, run_id=body.run_id
        ) from None
    if not created:
        return JSONResponse(intent_json(intent))
    # A stop recorded after the check but before the insert cancelled nothing of this intent:
    # look again, and cancel it now. (One recorded after the insert cancels it itself.)
    await plane.mirror.catch_up(plane.open.registry)
    hit = _stop_on(plane, intent)
    if hit is not None:
        scope, stop = hit
        cancelled = await store.cancel_for_stop(scope, stop.stop_id, time.time())
        await _audit_cancelled(plane, caller, scope, stop.stop_id, cancelled)
        intent = await store.get(intent.intent_id) or intent  # cancelled here, or by the stop's own hook
    await plane.audit(
        caller,
        "intent.create",
        intent.intent_id,
        "ok",
        intent.state,
        tool=intent.tool,
        run_id=intent.run_id,
        agent=intent.agent,
        idempotency_key=intent.idempotency_key,
    )
    return JSONResponse(intent_json(intent), status_code=201)


async def _audit_cancelled(
    plane: http.Plane, caller: Caller, scope: Scope, stop_id: str, cancelled: list[Intent]
) -> None:
    if cancelled:  # a stop that cancels nothing says so in its own record: no second one
        ids = [i.intent_id for i in cancelled]
        reason = f"cancelled {len(ids)} intent(s) for stop {stop_id}"
        await plane.audit(caller, "intent.cancel", str(scope), "ok", reason, stop_id=stop_id, intents=ids)


async def cancel_for_stop(plane: http.Plane, caller: Caller, stop: StopRecord) -> None:
    """Cancel the intents ``stop`` covers whose call was not made (pending, awaiting approval,
    claimed but never checked); called by ``POST /v1/stops``.

    The stop is recorded (and watchers notified) before this runs, and it is what stops the
    work: the executor checks the registry immediately before every commit, so an intent this
    fails to cancel is still never committed under the stop. So a failure here is logged and
    audited (when the audit log still works), and the stop is answered 201 all the same: a
    503 would tell the operator the stop was not issued, and a retry would issue a second one.
    """
    if stop.expires_at is not None and stop.expires_at <= time.time():
        return  # issued already expired: it stops nothing
    scope = Scope.parse(stop.scope)
    try:
        cancelled = await plane.open.intents.cancel_for_stop(scope, stop.stop_id, time.time())
        await _audit_cancelled(plane, caller, scope, stop.stop_id, cancelled)
    except RegistryUnavailable as exc:
        log.error("stop %s: cancelling its pending intents failed: %s", stop.stop_id, exc)
        try:
            reason = f"cancelling the pending intents of stop {stop.stop_id} failed: {exc}"
            await plane.audit(caller, "intent.cancel", stop.scope, "refused", reason, stop_id=stop.stop_id)
        except RegistryUnavailable:
            log.error("stop %s: and the audit log is unavailable too", stop.stop_id)


async def _readable(plane: http.Plane, caller: Caller, intent_id: str) -> Intent:
    intent = await plane.open.intents.get(intent_id)
    if intent is None:
        raise _unknown(intent_id)
    if caller.role == "agent" and intent.agent != caller.agent:
        raise Refused(403, "forbidden", f"intent {intent_id} belongs to another agent than {caller.agent}")
    return intent


async def get_intent(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "intent.read")
    return JSONResponse(intent_json(await _readable(plane, caller, request.path_params["intent_id"])))


async def list_intents(request: Request) -> Response:
    plane = http.plane_of(request)
    await plane.authorize(request, "intents.list")
    query = request.query_params
    limit = query_limit(request, most=MAX_BATCH)
    # ?state=a&state=b or ?state=a,b: any of them.
    states = [s for given in query.getlist("state") for s in given.split(",") if s] or None
    unknown = sorted(set(states or ()) - set(STATES))
    if unknown:
        raise Refused(422, "invalid_request", f"not intent states: {', '.join(unknown)}")
    intents = await plane.open.intents.list(run_id=query.get("run") or None, states=states, limit=limit)
    return JSONResponse(intents_json(intents))


async def claim_intent(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "intent.claim", write=True)
    intent = await plane.open.intents.claim_next(caller.name, time.time())
    if intent is None:  # nothing pending: nothing happened, nothing to audit
        return Response(status_code=204)
    await plane.audit(caller, "intent.claim", intent.intent_id, "ok", "claimed", tool=intent.tool)
    return JSONResponse(intent_json(intent))


async def _decide(request: Request, action: str, body_model: type[Body] | None) -> Response:
    """commit, fail, approve, reject: one intent moved by the store, refusals audited."""
    plane = http.plane_of(request)
    intent_id = request.path_params["intent_id"]
    audited = f"intent.{action}"
    caller = await plane.authorize(request, audited, intent_id, write=True)
    store = plane.open.intents
    now = time.time()
    try:
        body = None if body_model is None else await parse_body(request, body_model)
        if isinstance(body, CommitBody):
            intent = await store.commit(intent_id, caller.name, body.outcome, now)
            reason = "committed"
        elif isinstance(body, FailBody):
            intent = await store.fail(intent_id, caller.name, body.error, now)
            reason = body.error
        elif isinstance(body, RejectBody):
            intent = await store.reject(intent_id, caller.name, body.reason, now)
            reason = body.reason
        else:
            intent = await store.approve(intent_id, caller.name, now)
            reason = "approved"
    except Refused as exc:
        raise await _refuse(plane, caller, audited, intent_id, exc) from None
    except UnknownIntent:
        raise await _refuse(plane, caller, audited, intent_id, _unknown(intent_id)) from None
    except IntentStateError as exc:
        invalid = Refused(409, "invalid_transition", str(exc))
        raise await _refuse(plane, caller, audited, intent_id, invalid) from None
    await plane.audit(caller, audited, intent_id, "ok", reason, state=intent.state, run_id=intent.run_id)
    return JSONResponse(intent_json(intent))


async def commit_intent(request: Request) -> Response:
    return await _decide(request, "commit", CommitBody)


async def fail_intent(request: Request) -> Response:
    return await _decide(request, "fail", FailBody)


async def approve_intent(request: Request) -> Response:
    return await _decide(request, "approve", None)


async def reject_intent(request: Request) -> Response:
    return await _decide(request, "reject", RejectBody)


async def mark_unknown(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "intent.unknown", write=True)
    store = plane.open.intents
    marked = await store.mark_unknown(caller.name, time.time())
    # With those an earlier restart marked and nobody resolved: the executor's whole backlog.
    earlier = [i for i in await store.list(states=["unknown"], limit=100_000) if i.claimed_by == caller.name]
    ids = [i.intent_id for i in marked]
    intents = oldest_first([*marked, *(i for i in earlier if i.intent_id not in ids)])
    # Audited even when empty: an executor restarting is worth a line in the log.
    await plane.audit(
        caller, "intent.unknown", caller.name, "ok", f"{len(ids)} claimed intent(s) now unknown", intents=ids
    )
    return JSONResponse(intents_json(intents))


#: Who the control plane's own per-run intent limits write their stops as.
LIMIT_CALLER: Final = Caller("intent-limit", "tripwire")


async def check_intent(request: Request) -> Response:
    """The executor's final check, immediately before it performs a claimed intent's call.

    A stop cancels claimed intents that were never checked as it is issued; this check is what
    tells the executor (409 ``stopped``), and the backstop when that cancelling failed.

    Reads the registry (the mirror catches up with one ``MAX(revision)`` query), then either
    records ``checked_revision`` and answers 200 (perform the call now), or cancels the intent
    with the stop that matches it and answers 409 ``stopped``. A per-run limit
    (``[[intent_limits]]``) counts in the same write: the intent past it writes a stop for its
    run and is cancelled by it. A repeated check answers the first one, so an executor resolving
    an ``unknown`` intent re-issues the call only if the first check passed.
    """
    plane = http.plane_of(request)
    intent_id = request.path_params["intent_id"]
    caller = await plane.authorize(request, "intent.check", intent_id, write=True)
    store = plane.open.intents
    try:
        intent = await store.get(intent_id)
        if intent is None:
            raise _unknown(intent_id)
        if intent.state == "cancelled" and intent.stop_id and intent.claimed_by == caller.name:
            # A stop cancelled it while this executor held it, before its check: not performed.
            message = f"intent {intent_id} was cancelled by stop {intent.stop_id} before its check"
            raise Refused(409, "stopped", message, stop_id=intent.stop_id, intent=intent_json(intent))
        if intent.checked_revision is None:
            await plane.mirror.catch_up(plane.open.registry)
            revision = plane.mirror.stops.revision
            hit = _stop_on(plane, intent)
            if hit is None:
                limit = plane.config.intent_limit(intent.tool)
                try:
                    intent = await store.check(intent_id, caller.name, revision, time.time(), limit)
                except LimitReached as exc:
                    hit = await _limit_stop(plane, intent, exc)
            if hit is not None:
                raise await _cancel_claimed(plane, caller, intent, hit)
        else:
            intent = await store.check(intent_id, caller.name, intent.checked_revision, time.time())
    except Refused as exc:
        raise await _refuse(plane, caller, "intent.check", intent_id, exc) from None
    except UnknownIntent:
        raise await _refuse(plane, caller, "intent.check", intent_id, _unknown(intent_id)) from None
    except IntentStateError as exc:
        invalid = Refused(409, "invalid_transition", str(exc))
        raise await _refuse(plane, caller, "intent.check", intent_id, invalid) from None
    await plane.audit(
        caller, "intent.check", intent_id, "ok", f"no stop at revision {intent.checked_revision}",
        run_id=intent.run_id, revision=intent.checked_revision,
    )  # fmt: skip
    return JSONResponse(intent_json(intent))


async def _limit_stop(plane: http.Plane, intent: Intent, exc: LimitReached) -> tuple[Scope, StopRecord]:
    """The stop for a run past its limit: the one another check just wrote, else a new one
    (one replica writes one; two replicas at the same instant may write two)."""
    async with plane.limit_stops:
        await plane.mirror.catch_up(plane.open.registry)
        hit = _stop_on(plane, intent)
        if hit is not None:
            return hit
        reason = (
            f"intent limit: run {exc.run_id} asked for more than {exc.limit} {exc.tool} ({intent.intent_id})"
        )
        stop = await http.record_stop(plane, LIMIT_CALLER, f"run:{exc.run_id}", reason)
    return Scope("run", exc.run_id), stop


async def _cancel_claimed(
    plane: http.Plane, caller: Caller, intent: Intent, hit: tuple[Scope, StopRecord]
) -> Refused:
    """Cancel a claimed intent whose final check found ``hit``; the 409 to answer."""
    scope, stop = hit
    cancelled = await plane.open.intents.cancel_claimed(
        intent.intent_id, caller.name, stop.stop_id, time.time()
    )
    await _audit_cancelled(plane, caller, scope, stop.stop_id, [cancelled])
    refusal = _stopped(hit)
    refusal.extra["intent"] = intent_json(cancelled)
    return refusal


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
