"""Tripwire firings in shadow mode: what a rule would have stopped, recorded but not enforced.

A gateway's per-call rule in ``shadow`` mode (``haltwire.tripwires``) never refuses: it reports
the would-be firing (``POST /v1/tripwire-firings``, role ``tripwire``), and ``record`` writes it
as one ``stop.shadow`` audit record (the action the control plane's own shadow rules use), its
target the scope it would have stopped, with the rule, its kind, when it would have fired
(``fired_at``, the gateway's clock) and, for a run, the run's id, so the run report's timeline
shows it, and it is paged as a shadow firing (``[[notify]]``). A gateway retries a report whose
answer it lost: the firing id makes a repeat harmless. It is kept as a request key of the
reporting identity (the registry's, as for stops: one indexed read, not a scan of the target's
audit records), ``shadow-firing:ID``.
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass
from typing import Final

from haltwire.control.config import Caller
from haltwire.control.errors import invalid
from haltwire.control.pages import Event, page
from haltwire.control.plane import Plane
from haltwire.scope import Scope, ScopeError
from haltwire.store.audit import canonical_json
from haltwire.store.registry import RequestConflict

#: The audit action (shared with the control plane's own shadow rules) and the ``ROLES`` action.
ACTION: Final = "stop.shadow"
RECORD: Final = "tripwire.firing.record"


@dataclass(frozen=True, slots=True)
class Firing:
    firing_id: str
    rule: str
    kind: str
    scope: str
    reason: str
    fired_at: float


async def record(plane: Plane, caller: Caller, firing: Firing) -> bool:
    """Record ``firing`` once; False when its id was recorded before. A scope that does not parse
    is refused 422 (audited)."""
    try:
        scope = Scope.parse(firing.scope)
    except ScopeError as exc:
        raise await plane.refuse(caller, RECORD, "", invalid(str(exc))) from None
    run = {"run_id": scope.value} if scope.kind == "run" else {}
    key = f"shadow-firing:{firing.firing_id}"
    fingerprint = hashlib.sha256(canonical_json(list(astuple(firing))).encode()).hexdigest()
    async with plane.transaction():
        registry = plane.open.registry
        try:
            if await registry.requested(caller.name, key, fingerprint) is not None:
                return False
        except RequestConflict:
            return False  # the id came with other content: the first report stands
        await registry.remember(caller.name, key, fingerprint, "")
        await plane.audit(
            caller,
            ACTION,
            str(scope),
            "ok",
            f"would have stopped {scope}: {firing.reason}",
            rule=firing.rule,
            kind=firing.kind,
            firing_id=firing.firing_id,
            fired_at=firing.fired_at,
            **run,
        )
        # On-call hears of it too (``[[notify]]`` receivers that want shadow firings).
        shadow = Event(
            "shadow", firing.firing_id, str(scope), f"would have stopped {scope}: {firing.reason}",
            caller.name, firing.fired_at, rule=firing.rule, detail={"kind": firing.kind},
        )  # fmt: skip
        await page(plane, shadow)
    return True
