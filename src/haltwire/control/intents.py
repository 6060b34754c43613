"""Intents at the control plane: record, read, claim, the final check, settle, approve, reject.

The gateway records an intent for a call to an irreversible tool instead of calling it; the
executor claims intents one at a time, asks for the final registry check before each call
(``check``), commits or fails each one it claimed, and after a restart marks what it had
claimed ``unknown`` (it then re-issues those calls with their idempotency keys). Operators
approve or reject intents that wait for it. The states and their rules are ``haltwire.intents``.

Stops: a new intent is refused (409 ``stopped``, nothing recorded) when an active stop already
matches one of its scopes, and every stop cancels the intents its scope covers whose call was
not made as it is issued (``haltwire.control.stops``). A stop landing between the check and the
insert is caught by checking again after the insert. Every write commits with its audit record;
refused ones are audited too.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Final, Literal

from haltwire.control.access import ownership
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid, stopped_by
from haltwire.control.plane import Plane
from haltwire.control.stops import audit_cancelled, issue
from haltwire.intents import (
    IdempotencyConflict,
    Intent,
    IntentStateError,
    LimitReached,
    UnknownIntent,
    new_intent,
    oldest_first,
)
from haltwire.scope import Scope
from haltwire.stops import Stopped

#: Who the control plane's own per-run intent limits write their stops as.
LIMIT_CALLER: Final = Caller("intent-limit", "tripwire")

Decision = Literal["commit", "fail", "approve", "reject"]


def unknown(intent_id: str) -> Refused:
    return Refused(404, "unknown_intent", f"no intent has the id {intent_id}")


def stop_on(plane: Plane, intent: Intent) -> Stopped | None:
    """The active stop in the mirror that matches one of the intent's scopes, if any."""
    verdict = plane.mirror.stops.verdict(lambda: intent.scopes, time.time())
    return verdict if isinstance(verdict, Stopped) else None  # an intent has no grant to fence


def cancelled_before_check(intent: Intent, caller: Caller) -> Refused | None:
    """409 ``stopped`` for an intent a stop cancelled while this executor held it, before its
    check (it was not performed); None otherwise."""
    if intent.state == "cancelled" and intent.stop_id and intent.claimed_by == caller.name:
        message = f"intent {intent.intent_id} was cancelled by stop {intent.stop_id} before its check"
        return Refused(409, "stopped", message, stop_id=intent.stop_id, intent=asdict(intent))
    return None


async def create(plane: Plane, caller: Caller, **fields: Any) -> tuple[Intent, bool]:
    """Record an intent (``fields``: as ``haltwire.intents.new_intent`` takes them, less ``now``);
    answers it and whether it is new (False: the key had recorded it before)."""
    store = plane.open.intents
    key, run_id = str(fields["idempotency_key"]), fields.get("run_id")
    try:
        new = new_intent(now=time.time(), **fields)
    except ValueError as exc:
        raise await plane.refuse(caller, "intent.create", key, invalid(str(exc)), run_id=run_id) from None
    await plane.catch_up()
    hit = stop_on(plane, new)
    # A repeat of a call recorded before the stop still answers what was recorded.
    if hit is not None and await store.by_key(new.agent, key) is None:
        # With its run, so the run's report shows the call the stop refused.
        raise await plane.refuse(caller, "intent.create", key, stopped_by(hit), run_id=run_id)
    try:
        async with plane.transaction():
            intent, created = await store.create(new)
            if not created:
                return intent, False
            # A stop recorded after the check but before the insert cancelled nothing of this
            # intent: look again, and cancel it now. (One recorded after the insert cancels it.)
            await plane.catch_up()
            hit = stop_on(plane, intent)
            if hit is not None:
                cancelled = await store.cancel_for_stop(hit.scope, hit.stop.stop_id, time.time())
                await audit_cancelled(plane, caller, hit.scope, hit.stop.stop_id, cancelled)
                intent = await store.get(intent.intent_id) or intent  # cancelled here, or by the stop
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
    except IdempotencyConflict as exc:
        conflict = Refused(409, "idempotency_conflict", str(exc))
        raise await plane.refuse(caller, "intent.create", key, conflict, run_id=run_id) from None
    return intent, True


async def readable(plane: Plane, caller: Caller, intent_id: str) -> Intent:
    """The intent, if the caller may read it (an agent reads its own only, as its runs:
    ``access.ownership``; another tenant's is answered as unknown)."""
    intent = await plane.open.intents.get(intent_id)
    if intent is None:
        raise unknown(intent_id)
    whose = ownership(caller, intent.agent, intent.tenant) if caller.role == "agent" else "own"
    if whose == "another_tenant":
        raise unknown(intent_id)
    if whose == "another_agent":
        raise Refused(403, "forbidden", f"intent {intent_id} belongs to another agent than {caller.agent}")
    return intent


async def claim(plane: Plane, caller: Caller) -> Intent | None:
    """The oldest pending intent, claimed for the calling executor; None when nothing is pending."""
    async with plane.transaction():
        intent = await plane.open.intents.claim_next(caller.name, time.time())
        if intent is not None:  # nothing pending: nothing happened, nothing to audit
            await plane.audit(caller, "intent.claim", intent.intent_id, "ok", "claimed", tool=intent.tool)
    return intent


async def decide(plane: Plane, caller: Caller, action: Decision, intent_id: str, said: Any = None) -> Intent:
    """commit (``said``: the outcome), fail (the error), approve, reject (the reason): one intent
    moved by the store, refusals audited."""
    store = plane.open.intents
    audited = f"intent.{action}"
    now = time.time()
    try:
        async with plane.transaction():
            if action == "commit":
                intent, reason = await store.commit(intent_id, caller.name, said, now), "committed"
            elif action == "fail":
                intent, reason = await store.fail(intent_id, caller.name, said, now), str(said)
            elif action == "reject":
                intent, reason = await store.reject(intent_id, caller.name, said, now), str(said)
            else:
                intent, reason = await store.approve(intent_id, caller.name, now), "approved"
            await plane.audit(
                caller, audited, intent_id, "ok", reason, state=intent.state, run_id=intent.run_id
            )
    except UnknownIntent:
        raise await plane.refuse(caller, audited, intent_id, unknown(intent_id)) from None
    except IntentStateError as exc:
        invalid_move = Refused(409, "invalid_transition", str(exc))
        raise await plane.refuse(caller, audited, intent_id, invalid_move) from None
    return intent


async def mark_unknown(plane: Plane, caller: Caller) -> list[Intent]:
    """A restarted executor's whole backlog: what it had claimed (now ``unknown``) and the
    ``unknown`` ones an earlier restart marked that nobody resolved, oldest first."""
    store = plane.open.intents
    async with plane.transaction():
        marked = await store.mark_unknown(caller.name, time.time())
        earlier = [
            i for i in await store.list(states=["unknown"], limit=100_000) if i.claimed_by == caller.name
        ]
        ids = [i.intent_id for i in marked]
        # Audited even when empty: an executor restarting is worth a line in the log.
        await plane.audit(
            caller,
            "intent.unknown",
            caller.name,
            "ok",
            f"{len(ids)} claimed intent(s) now unknown",
            intents=ids,
        )
    return oldest_first([*marked, *(i for i in earlier if i.intent_id not in ids)])


async def check(plane: Plane, caller: Caller, intent_id: str) -> Intent:
    """The executor's final check, immediately before it performs a claimed intent's call.

    A stop cancels claimed intents that were never checked as it is issued; this check is what
    tells the executor (409 ``stopped``), and the backstop when that cancelling failed.

    Reads the registry (the mirror catches up with one ``MAX(revision)`` query), then either
    records ``checked_revision`` (perform the call now), or cancels the intent with the stop
    that matches it and refuses 409 ``stopped``. A per-run limit (``[[intent_limits]]``) counts
    in the same write: the intent past it writes a stop for its run and is cancelled by it. A
    repeated check answers the first one, so an executor resolving an ``unknown`` intent
    re-issues the call only if the first check passed.
    """
    store = plane.open.intents
    try:
        intent = await store.get(intent_id)
        if intent is None:
            raise unknown(intent_id)
        stopped = cancelled_before_check(intent, caller)
        if stopped is not None:
            raise stopped
        if intent.checked_revision is None:
            revision = (await plane.catch_up()).stops.revision
            hit = stop_on(plane, intent)
            if hit is None:
                limit = plane.config.intent_limit(intent.tool)
                try:
                    return await _passed(plane, caller, intent_id, revision, limit)
                except LimitReached as exc:
                    hit = await _limit_stop(plane, intent, exc)
            raise await _cancel_claimed(plane, caller, intent, hit)
        return await _passed(plane, caller, intent_id, intent.checked_revision, None)
    except Refused as exc:
        raise await plane.refuse(caller, "intent.check", intent_id, exc) from None
    except UnknownIntent:
        raise await plane.refuse(caller, "intent.check", intent_id, unknown(intent_id)) from None
    except IntentStateError as exc:
        invalid_move = Refused(409, "invalid_transition", str(exc))
        raise await plane.refuse(caller, "intent.check", intent_id, invalid_move) from None


async def _passed(plane: Plane, caller: Caller, intent_id: str, revision: int, limit: int | None) -> Intent:
    """Record that the check passed at ``revision``, and audit it, in one transaction
    (``LimitReached``: past its run's limit, nothing recorded)."""
    async with plane.transaction():
        intent = await plane.open.intents.check(intent_id, caller.name, revision, time.time(), limit)
        await plane.audit(
            caller, "intent.check", intent_id, "ok", f"no stop at revision {intent.checked_revision}",
            run_id=intent.run_id, revision=intent.checked_revision,
        )  # fmt: skip
    return intent


async def _limit_stop(plane: Plane, intent: Intent, exc: LimitReached) -> Stopped:
    """The stop for a run past its limit: the one another check just wrote, else a new one
    (one replica writes one; two replicas at the same instant may write two)."""
    async with plane.limit_stops:
        await plane.catch_up()
        hit = stop_on(plane, intent)
        if hit is not None:
            return hit
        reason = (
            f"intent limit: run {exc.run_id} asked for more than {exc.limit} {exc.tool} ({intent.intent_id})"
        )
        stop = (await issue(plane, LIMIT_CALLER, f"run:{exc.run_id}", reason)).stop
    return Stopped(Scope("run", exc.run_id), stop)


async def _cancel_claimed(plane: Plane, caller: Caller, intent: Intent, hit: Stopped) -> Refused:
    """Cancel a claimed intent whose final check found ``hit``; the 409 to answer."""
    async with plane.transaction():
        cancelled = await plane.open.intents.cancel_claimed(
            intent.intent_id, caller.name, hit.stop.stop_id, time.time()
        )
        await audit_cancelled(plane, caller, hit.scope, hit.stop.stop_id, [cancelled])
    refusal = stopped_by(hit)
    refusal.extra["intent"] = asdict(cancelled)
    return refusal
