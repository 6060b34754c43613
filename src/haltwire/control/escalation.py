"""Escalation: tripwire stops of runs, counted in a window, stop a tenant, an agent version, an agent.

Tripwires stop the run, not the fleet; when several runs trip, the rules of ``[[escalations]]``
widen the stop (the seed: "escalate from run to tenant to agent version as more runs trip").
A trip is a ``run:`` stop issued by a caller of role ``tripwire`` (the gateway's tripwires
through the API, ``intent-limit``, ``wall-clock``) of a registered run, not cleared; never a
drill's (a drill identity's stop, a drill run's: ``haltwire.control.drills``). For each
rule, the trips in the new trip's group (its run's tenant; its agent version; its agent; every
run, for ``global``) issued within ``window_s`` are counted, by distinct run or distinct tenant;
at ``count``, the rule fires:

- ``enforce``: it writes a stop on the group's scope, issued by ``escalation``, whose reason
  names the rule and the stops that caused it (their ids and runs) and whose ``stop.issue``
  audit record carries ``rule`` and ``caused_by``; unless an active stop is on that scope already
  (then nothing is written: one tenant stop, however many more runs trip);
- ``shadow``: it writes no stop, only a ``stop.shadow`` audit record saying what it would have
  stopped and why;
- ``off``: nothing.

Either way a rule counts only the trips after its last firing on a scope (``store.trips``), so
the trips behind one escalation never cause another; once a tenant stop is cleared, ``count``
new trips are needed to stop it again. Nothing escalates to ``global`` unless a rule says
``to = "global"``.

Evaluated by ``stops.issue`` inside the transaction that writes the trip, after it: the trip and
the escalation it causes commit together or not at all, so a crash between them loses neither,
and a stop's 201 means its escalation, if any, is written and pushed. The trip's own write took
the registry's lock (an advisory lock on PostgreSQL, the file's write lock on SQLite), so two
trips committing at once, through two replicas too, are counted one after the other: the second
finds the first's escalation and writes no second one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Final, Protocol

from haltwire.control.config import RULE_CALLERS, Caller, Escalation
from haltwire.control.pages import Event, page
from haltwire.control.plane import Plane
from haltwire.limits import MAX_REASON_CHARS
from haltwire.scope import Scope, ScopeError
from haltwire.stops import StopRecord
from haltwire.store.runs import RunRecord
from haltwire.store.trips import Group, Trip

#: Who escalation stops are issued by.
ESCALATION_CALLER: Final = Caller("escalation", "tripwire")


class Record(Protocol):
    """How a stop is written inside the open transaction (``stops.record``)."""

    def __call__(
        self,
        plane: Plane,
        caller: Caller,
        scope: str,
        reason: str,
        now: float,
        expires_at: float | None = None,
        **detail: Any,
    ) -> Awaitable[StopRecord]: ...


def tripwire_actors(plane: Plane) -> list[str]:
    """The names whose ``run:`` stops are trips: the config's tripwire identities and the control
    plane's own rules (no identity may take their names: ``RULE_CALLERS``)."""
    names = {c.name for c in plane.callers.values() if c.role == "tripwire" and not c.drill}
    return sorted(names | (RULE_CALLERS - {ESCALATION_CALLER.name}))


def target(rule: Escalation, run: RunRecord) -> tuple[str, Group, str]:
    """The scope ``rule`` stops for a trip of ``run``, the group its trips are counted in, and
    the group in words."""
    if rule.to == "tenant":
        return f"tenant:{run.tenant}", Group(tenant=run.tenant), f"tenant {run.tenant}"
    if rule.to == "version":
        at = f"{run.agent}@{run.version}"
        return f"version:{at}", Group(agent=run.agent, version=run.version), f"agent version {at}"
    if rule.to == "agent":
        return f"agent:{run.agent}", Group(agent=run.agent), f"agent {run.agent}"
    return "global", Group(), "every agent"


def counted(trips: Sequence[Trip], unit: str) -> int:
    return len({t.tenant if unit == "tenants" else t.run_id for t in trips})


def reason_for(rule: Escalation, what: str, trips: Sequence[Trip]) -> str:
    """The escalation stop's reason: the rule, its figures, and the stops that caused it (as
    many as fit; the audit record's ``caused_by`` lists every one)."""
    n = counted(trips, rule.unit)
    head = (
        f"escalation {rule.rule}: {n} {rule.unit} of {what} tripped within {rule.window_s:g} s "
        f"(the rule's count: {rule.count}); stops "
    )
    named = [f"{t.stop_id} (run {t.run_id}, tenant {t.tenant})" for t in trips]
    text = head + ", ".join(named)
    while len(text) > MAX_REASON_CHARS and named:
        named.pop()
        text = head + ", ".join(named) + f" and {len(trips) - len(named)} more"
    return text


async def escalate(
    plane: Plane, caller: Caller, stop: StopRecord, now: float, record: Record
) -> tuple[StopRecord, ...]:
    """Count ``stop`` (just written in the open transaction) for every rule, if it is a trip; the
    stops the rules wrote (the module's docstring)."""
    rules = [r for r in plane.config.escalations if r.mode != "off"]
    if not rules or caller.role != "tripwire" or caller.drill or not stop.scope.startswith("run:"):
        return ()  # a drill's stops are no incident (``haltwire.control.drills``)
    if stop.expires_at is not None and stop.expires_at <= now:
        return ()  # issued already expired: it stopped nothing
    stores = plane.open
    run = await stores.runs.get(stop.scope.removeprefix("run:"))
    if run is None or plane.drills.of_tenant(run.tenant):
        return ()  # a run never registered: no tenant, no version to count it in; or a drill's
    actors = tripwire_actors(plane)
    written: list[StopRecord] = []
    for rule in rules:
        scope, group, what = target(rule, run)
        try:
            Scope.parse(scope)
        except ScopeError:
            continue  # names too long for one scope (agent and version near their limits): never the trip's fault
        after = now - rule.window_s
        last = await stores.trips.last_escalation(rule.rule, scope)
        if last is not None:
            after = max(after, last)
        trips = [t for t in await stores.trips.trips(actors, group, after) if not plane.drills.of_tenant(t.tenant)]
        if counted(trips, rule.unit) < rule.count:
            continue
        causes = [t.stop_id for t in trips]
        reason = reason_for(rule, what, trips)
        if rule.mode == "shadow":
            await stores.trips.record_escalation(rule.rule, scope, now, "shadow", None, causes)
            await plane.audit(
                ESCALATION_CALLER, "stop.shadow", scope, "ok", f"would have stopped {scope}: {reason}",
                rule=rule.rule, caused_by=causes,
            )  # fmt: skip
            shadow = Event(
                "shadow", f"shadow:{rule.rule}:{scope}:{now:.3f}", scope, f"would have stopped {scope}: {reason}",
                ESCALATION_CALLER.name, now, rule=rule.rule, detail={"caused_by": causes},
            )  # fmt: skip
            await page(plane, shadow)
            continue
        if await stores.trips.active_stop_on(scope, now) is not None:
            continue  # stopped already: one stop on the scope, however many more runs trip
        escalation = await record(plane, ESCALATION_CALLER, scope, reason, now, rule=rule.rule, caused_by=causes)
        await stores.trips.record_escalation(rule.rule, scope, now, "enforce", escalation.stop_id, causes)
        written.append(escalation)
    return tuple(written)
