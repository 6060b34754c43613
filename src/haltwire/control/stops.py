"""Issuing and clearing stops: the registry write, its audit record, the intents it cancels, the push.

``issue`` is the one way a stop is written, for operators and tripwires through the API and for
the control plane's own rules (``[[intent_limits]]``). In one transaction:

1. the registry records the stop (the revision it gets is what every fence compares with);
2. the audit log records who issued it and why, naming the registry change (its revision and
   digest: the audit chain covers the registry's rows);
3. the intents it covers whose call was not made (pending, awaiting approval, claimed but never
   checked) are cancelled, and that is audited too;
4. with ``[[notify]]``, a page for each receiver goes to the outbox (``pages.page``), unless
   it is a drill's stop (``haltwire.control.drills``);
5. a tripwire's stop of a run is counted by the escalation rules (``[[escalations]]``,
   ``haltwire.control.escalation``), and a rule it takes past its count writes its own stop
   (steps 1 to 4 again) in the same transaction: ``Written.escalated``;

then, committed, every watcher is woken (the push path to gateways, executors and runtimes),
and the page sender with them: it posts from a task of its own, so no receiver is waited for.
So a stop is answered only once all of it is durable; if any step fails, nothing of it is
written, nothing is pushed, and the answer (503) says so. A request key (``Idempotency-Key``)
makes issuing and clearing safe to retry: a repeat answers what the first request wrote.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from haltwire.control.access import visible_to
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid
from haltwire.control.escalation import escalate
from haltwire.control.pages import page, stop_event
from haltwire.control.plane import Plane
from haltwire.control.receivers import PageEvent
from haltwire.intents import Intent
from haltwire.scope import Scope, ScopeError
from haltwire.stops import Change, StopRecord
from haltwire.store.audit import canonical_json
from haltwire.store.registry import AlreadyCleared, RequestConflict, UnknownStop, clear_row, digest, issue_row

#: Changes a watch reads from the registry at once.
REPLAY_PAGE: Final = 25


@dataclass(frozen=True, slots=True)
class Written:
    """A stop as a request wrote or cleared it; ``replayed``: an earlier request with the same
    key did, and this one wrote nothing."""

    stop: StopRecord
    replayed: bool = False
    #: The stops the escalation rules wrote in the same transaction because of this one, each
    #: its own record (and audited): whoever acts on a stop once it is issued acts on these too.
    escalated: tuple[StopRecord, ...] = ()


def change_ref(row: Sequence[Any]) -> dict[str, Any]:
    """What an audit record says of the registry change it records (``haltwire.control.audit``
    checks the registry's rows against it)."""
    return {"revision": row[0], "sha256": digest(row)}


def _fingerprint(*fields: object) -> str:
    return hashlib.sha256(canonical_json(list(fields)).encode()).hexdigest()


async def _replayed(plane: Plane, caller: Caller, key: str | None, fingerprint: str) -> Written | None:
    """The answer to an earlier request with this key, inside the request's transaction."""
    if key is None:
        return None
    registry = plane.open.registry
    stop_id = await registry.requested(caller.name, key, fingerprint)
    stop = None if stop_id is None else await registry.get_stop(stop_id)
    return None if stop is None else Written(stop, replayed=True)


def _conflict(exc: RequestConflict) -> Refused:
    return Refused(409, "idempotency_conflict", f"{exc}; use a new key for a new request")


async def issue(
    plane: Plane,
    caller: Caller,
    scope: str,
    reason: str,
    expires_at: float | None = None,
    request_key: str | None = None,
    rule: str | None = None,
) -> Written:
    """Record a stop and everything that follows from it (the module's docstring).
    ``rule``: the tripwire rule that fired (a tripwire's only), in the audit record and the page.
    ``Refused`` 422 (audited) for a scope that does not parse, an empty reason or a rule named by
    another role, 409 ``idempotency_conflict`` for a key used before for another stop."""
    registry = plane.open.registry
    if rule is not None and caller.role != "tripwire":
        raise await plane.refuse(caller, "stop.issue", scope, invalid("rule: only a tripwire names the rule that fired"))
    # The rule only when named, so a key's fingerprint from before rules were named is unchanged.
    fingerprint = _fingerprint("stop.issue", scope, reason, expires_at, *([rule] if rule else []))
    try:
        async with plane.transaction():
            earlier = await _replayed(plane, caller, request_key, fingerprint)
            if earlier is not None:
                return earlier
            now = time.time()
            stop = await record(plane, caller, scope, reason, now, expires_at, **({"rule": rule} if rule else {}))
            if request_key is not None:
                await registry.remember(caller.name, request_key, fingerprint, stop.stop_id)
            escalated = await escalate(plane, caller, stop, now, record)
    except (ScopeError, ValueError) as exc:
        raise await plane.refuse(caller, "stop.issue", "", invalid(str(exc))) from None
    except RequestConflict as exc:
        raise await plane.refuse(caller, "stop.issue", scope, _conflict(exc)) from None
    plane.notify()
    return Written(stop, escalated=escalated)


async def record(
    plane: Plane,
    caller: Caller,
    scope: str,
    reason: str,
    now: float,
    expires_at: float | None = None,
    **detail: Any,
) -> StopRecord:
    """Steps 1 to 4 of issuing a stop (the module's docstring), inside the caller's transaction;
    ``detail``: more for the stop's audit record (the rule that wrote it, say; an escalation's
    ``caused_by`` makes its page an escalation's)."""
    stop = await plane.open.registry.issue_stop(scope, reason, caller.name, now=now, expires_at=expires_at)
    ref = change_ref(issue_row(stop))
    await plane.audit(
        caller, "stop.issue", stop.scope, "ok", stop.reason, stop_id=stop.stop_id, change=ref, **detail
    )
    scope_ = Scope.parse(stop.scope)
    # Issued already expired, it stops nothing; a model stop stops model calls, never an intent.
    if (stop.expires_at is None or stop.expires_at > now) and scope_.kind != "model":
        cancelled = await plane.open.intents.cancel_for_stop(scope_, stop.stop_id, now)
        await audit_cancelled(plane, caller, scope_, stop.stop_id, cancelled)
    rule = detail.get("rule") or (caller.name if caller.role == "tripwire" else None)  # a tripwire's stop names it
    kind: PageEvent = "escalation" if "caused_by" in detail else "stop"
    if not (caller.drill or await plane.drills.of_stop(stop, plane.run_tenant)):  # a drill pages no one
        await page(plane, stop_event(stop, rule, kind))  # to the outbox only: sent after the commit
    return stop


async def clear(
    plane: Plane, caller: Caller, stop_id: str, reason: str, request_key: str | None = None
) -> Written:
    """Record who cleared a stop and why; ``Refused`` 404 / 409 / 422 (audited) when it cannot be."""
    registry = plane.open.registry
    fingerprint = _fingerprint("stop.clear", stop_id, reason)
    try:
        async with plane.transaction():
            earlier = await _replayed(plane, caller, request_key, fingerprint)
            if earlier is not None:
                return earlier
            stop = await registry.clear_stop(stop_id, caller.name, reason, now=time.time())
            if request_key is not None:
                await registry.remember(caller.name, request_key, fingerprint, stop_id)
            ref = change_ref(clear_row(stop))
            await plane.audit(caller, "stop.clear", stop_id, "ok", reason, scope=stop.scope, change=ref)
    except UnknownStop:
        problem = Refused(404, "unknown_stop", f"no stop has the id {stop_id}")
        raise await plane.refuse(caller, "stop.clear", stop_id, problem) from None
    except AlreadyCleared as exc:
        raise await plane.refuse(
            caller, "stop.clear", stop_id, Refused(409, "already_cleared", str(exc))
        ) from None
    except ValueError as exc:  # a blank or unfit reason
        raise await plane.refuse(caller, "stop.clear", stop_id, invalid(str(exc))) from None
    except RequestConflict as exc:
        raise await plane.refuse(caller, "stop.clear", stop_id, _conflict(exc)) from None
    plane.notify()
    return Written(stop)


async def listed(plane: Plane, caller: Caller, every: bool) -> list[StopRecord]:
    """The active stops (``every``: all ever issued) the caller may see."""
    registry = plane.open.registry
    stops = await registry.all_stops() if every else await registry.active_stops(now=time.time())
    return [s for s in stops if await visible_to(plane, caller, s.scope)]


async def changes_after(plane: Plane, caller: Caller, revision: int) -> tuple[list[Change], int]:
    """The next page of registry changes after ``revision`` that ``caller`` may see, and the
    last revision read (past the page when the caller may see none of it).

    Pages are small and read a few at a time (``Plane.replay_reads``): a watch replaying a long
    history holds one page, not the history, so a hundred watchers replaying at once cost the
    control plane megabytes, not gigabytes.
    """
    async with plane.replay_reads:
        page = await plane.open.registry.changes_since(revision, limit=REPLAY_PAGE)
    last = page[-1].revision if page else revision
    return [c for c in page if await visible_to(plane, caller, c.stop.scope)], last


async def audit_cancelled(
    plane: Plane, caller: Caller, scope: Scope, stop_id: str, cancelled: list[Intent]
) -> None:
    """One ``intent.cancel`` record for the intents one stop cancelled."""
    if cancelled:  # a stop that cancels nothing says so in its own record: no second one
        ids = [i.intent_id for i in cancelled]
        reason = f"cancelled {len(ids)} intent(s) for stop {stop_id}"
        await plane.audit(caller, "intent.cancel", str(scope), "ok", reason, stop_id=stop_id, intents=ids)
