"""Issuing and clearing stops: the registry write, the watchers woken, the audit, the intents cancelled.

``issue`` is the one way a stop is written, for operators and tripwires through the API and for
the control plane's own rules (``[[intent_limits]]``), in this order:

1. the registry records the stop (the revision it gets is what every fence compares with);
2. every watcher is woken (the push path to gateways, executors and runtimes);
3. the audit log records who issued it and why;
4. the intents it covers whose call was not made (pending, awaiting approval, claimed but never
   checked) are cancelled, so once a stop is answered nothing it covers is still pending.

A failure in step 4 is logged and audited, not raised: the stop stands, and the executor's
final check refuses those intents anyway. A 503 would tell the operator the stop was not
issued, and a second attempt would issue a second stop.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from haltwire.control.access import visible_to
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid
from haltwire.control.plane import Plane
from haltwire.intents import Intent
from haltwire.scope import Scope, ScopeError
from haltwire.stops import Change, StopRecord
from haltwire.store.registry import AlreadyCleared, RegistryUnavailable, UnknownStop

log = logging.getLogger("haltwire.intents")

#: Changes a watch reads from the registry at once.
REPLAY_PAGE: Final = 25


async def issue(
    plane: Plane, caller: Caller, scope: str, reason: str, expires_at: float | None = None
) -> StopRecord:
    """Record a stop and everything that follows from it (the module's docstring).
    ``Refused`` 422 (audited) for a scope that does not parse or an empty reason."""
    try:
        stop = await plane.open.registry.issue_stop(
            scope, reason, caller.name, now=time.time(), expires_at=expires_at
        )
    except (ScopeError, ValueError) as exc:
        await plane.audit(caller, "stop.issue", "", "refused", str(exc))
        raise invalid(str(exc)) from None
    plane.notify()
    await plane.audit(caller, "stop.issue", stop.scope, "ok", stop.reason, stop_id=stop.stop_id)
    await _cancel_intents(plane, caller, stop)
    return stop


async def clear(plane: Plane, caller: Caller, stop_id: str, reason: str) -> StopRecord:
    """Record who cleared a stop and why; ``Refused`` 404 / 409 (audited) when it cannot be."""
    try:
        stop = await plane.open.registry.clear_stop(stop_id, caller.name, reason, now=time.time())
    except UnknownStop:
        await plane.audit(caller, "stop.clear", stop_id, "refused", "no such stop")
        raise Refused(404, "unknown_stop", f"no stop has the id {stop_id}") from None
    except AlreadyCleared as exc:
        await plane.audit(caller, "stop.clear", stop_id, "refused", str(exc))
        raise Refused(409, "already_cleared", str(exc)) from None
    except ValueError as exc:  # a blank or unfit reason
        await plane.audit(caller, "stop.clear", stop_id, "refused", str(exc))
        raise invalid(str(exc)) from None
    plane.notify()
    await plane.audit(caller, "stop.clear", stop_id, "ok", reason, scope=stop.scope)
    return stop


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


async def _cancel_intents(plane: Plane, caller: Caller, stop: StopRecord) -> None:
    if stop.expires_at is not None and stop.expires_at <= time.time():
        return  # issued already expired: it stops nothing
    scope = Scope.parse(stop.scope)
    try:
        cancelled = await plane.open.intents.cancel_for_stop(scope, stop.stop_id, time.time())
        await audit_cancelled(plane, caller, scope, stop.stop_id, cancelled)
    except RegistryUnavailable as exc:
        log.error("stop %s: cancelling its pending intents failed: %s", stop.stop_id, exc)
        try:
            reason = f"cancelling the pending intents of stop {stop.stop_id} failed: {exc}"
            await plane.audit(caller, "intent.cancel", stop.scope, "refused", reason, stop_id=stop.stop_id)
        except RegistryUnavailable:
            log.error("stop %s: and the audit log is unavailable too", stop.stop_id)
