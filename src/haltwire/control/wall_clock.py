"""The wall-clock budget: a run older than its agent class's ``max_wall_clock_s`` is stopped.

Age is wall-clock time since the run registered (``registered_at``, by the lease desk's clock,
which this rule reads too). Two places enforce it:

- ``sweep``: one task per control-plane process that serves operators (``create_app(...,
  rules=True)``; not the agents' process), owned by the app's lifespan and cancelled with it at
  shutdown. Every ``[wall_clock] check_every_s`` it reads the runs that crossed their bound since
  its last look (at start-up, every run not ended: a restart catches up) and stops each that no
  active stop covers yet, so a run is stopped at most ``check_every_s`` (plus one store round
  trip) after its bound. A run another stop covered when it was looked at is left to that stop;
  if that stop is cleared, the run's next renewal stops it (below). A look cancelled midway
  writes nothing half: each run's stop is its own transaction, and what is left is found at the
  next look or the next start.
- the lease desk's renewals (``haltwire.control.runs.renew``): a run past its bound is stopped
  there and then, so its renewal is refused ``stopped`` naming that stop, as any stopped run's is,
  even between two looks.

The stop is a ``run:`` stop issued by ``wall-clock`` (role ``tripwire``: the escalation rules
count it) through ``stops.issue``, its reason giving the figures (registered at, age, bound),
with the request key ``wall-clock:RUN``: of two replicas (or the sweep and a renewal) that find
the same run at once, the registry writes one stop, and the other is answered it (or refused
``idempotency_conflict``, the two reasons' ages differing, which counts as done). Then the run is
marked (``store.trips``), and is not looked at again: an operator who clears a wall-clock stop
lets the run go on. In ``shadow`` mode nothing is stopped: a ``stop.shadow`` audit record says
what would have been, once per run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Final

import anyio

from haltwire.control.config import AgentClass, Caller
from haltwire.control.errors import Refused
from haltwire.control.plane import Plane
from haltwire.control.stops import Written, issue
from haltwire.stops import Stopped
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.runs import RunRecord

log = logging.getLogger("haltwire.control")

#: Who wall-clock stops are issued by.
WALL_CLOCK_CALLER: Final = Caller("wall-clock", "tripwire")
#: Runs read at a time.
PAGE: Final = 500
#: Each look re-reads this much before the last one's horizon: a run registered (by its
#: registrar's clock) just before a look but committed just after it is not missed.
SLACK_S: Final = 60.0


def bound(plane: Plane, run: RunRecord) -> AgentClass | None:
    """The run's class, if it has a wall-clock bound in a mode that acts."""
    if plane.leases is None:
        return None
    cls = plane.leases.agent_class(run.agent_class)
    if cls.max_wall_clock_s is None or cls.wall_clock_mode == "off":
        return None
    return cls


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def reason_for(run: RunRecord, limit: float, now: float) -> str:
    return (
        f"wall clock: run {run.run_id} registered at {_iso(run.registered_at)} is {now - run.registered_at:.1f} s "
        f"old, past its bound of {limit:g} s (agent class {run.agent_class})"
    )


def _covered(plane: Plane, run: RunRecord, now: float) -> bool:
    return isinstance(plane.mirror.stops.verdict(lambda: run.scopes, now), Stopped)


async def stop_overdue(plane: Plane, run: RunRecord, now: float) -> Written | None:
    """Stop ``run``, past its bound at ``now`` (or, in shadow, audit that it would be), once; the
    stop written (or answered: another replica wrote it), None when none was."""
    cls = bound(plane, run)
    assert cls is not None and cls.max_wall_clock_s is not None
    scope, reason = f"run:{run.run_id}", reason_for(run, cls.max_wall_clock_s, now)
    trips = plane.open.trips
    if cls.wall_clock_mode == "shadow":
        async with plane.transaction():
            if await trips.mark_overdue(run.run_id, now, "shadow", None):
                await plane.audit(
                    WALL_CLOCK_CALLER, "stop.shadow", scope, "ok", f"would have stopped {scope}: {reason}",
                    rule="wall_clock", run_id=run.run_id, registered_at=run.registered_at,
                    bound_s=cls.max_wall_clock_s,
                )  # fmt: skip
        return None
    written: Written | None = None
    try:
        written = await issue(plane, WALL_CLOCK_CALLER, scope, reason, request_key=f"wall-clock:{run.run_id}")
    except Refused as exc:
        if exc.code != "idempotency_conflict":
            raise
        # Another replica (or a renewal) wrote it a moment ago, with another age in its reason.
    async with plane.transaction():
        await trips.mark_overdue(run.run_id, now, "enforce", written.stop.stop_id if written else None)
    return written


async def check_renewal(plane: Plane, runs: list[RunRecord]) -> bool:
    """Stop the runs among ``runs`` (about to be renewed) that are past their bound, enforced,
    not yet stopped and not yet marked; whether any was (the desk must catch up again)."""
    if plane.leases is None:
        return False
    now = plane.leases.clock()
    stopped = False
    for run in runs:
        cls = bound(plane, run)
        if cls is None or cls.wall_clock_mode != "enforce" or run.ended:
            continue
        assert cls.max_wall_clock_s is not None
        if now - run.registered_at <= cls.max_wall_clock_s or _covered(plane, run, now):
            continue
        if await plane.open.trips.is_overdue(run.run_id):
            continue  # stopped once already; a cleared wall-clock stop lets the run go on
        await stop_overdue(plane, run, now)
        stopped = True
    return stopped


def _looks(plane: Plane) -> Iterator[tuple[str, list[str], bool, float]]:
    """For each class with a bound: a key, the classes its query names (``other_than``: the
    runs of any class but those, for ``default``, which stands in for classes since removed),
    and the bound."""
    classes = plane.config.agent_classes
    for name, cls in classes.items():
        if cls.max_wall_clock_s is None or cls.wall_clock_mode == "off":
            continue
        if name == "default":
            yield name, [n for n in classes if n != "default"], True, cls.max_wall_clock_s
        else:
            yield name, [name], False, cls.max_wall_clock_s


class Sweep:
    """The sweep's memory: how far each class's runs were looked at."""

    def __init__(self, plane: Plane, clock: Callable[[], float]) -> None:
        self.plane = plane
        self.clock = clock
        #: Per class: every run registered up to here was looked at (from the epoch: every run).
        self.looked: dict[str, float] = {}

    async def look(self) -> int:
        """One look at every class; how many runs it stopped (or, in shadow, audited)."""
        plane = self.plane
        await plane.catch_up()
        now = self.clock()
        acted = 0
        for key, classes, other_than, limit in _looks(plane):
            horizon = now - limit
            after = self.looked.get(key, 0.0)
            while True:
                runs = await plane.open.trips.overdue(after, horizon, classes, other_than, PAGE)
                for run in runs:  # none marked: the query leaves those out
                    if not _covered(plane, run, now) and bound(plane, run) is not None:
                        await stop_overdue(plane, run, now)
                        acted += 1
                if len(runs) < PAGE:
                    break
                after = runs[-1].registered_at
            self.looked[key] = horizon - SLACK_S
        return acted


async def sweep(plane: Plane) -> None:
    """Look every ``[wall_clock] check_every_s`` until cancelled (by the app's lifespan). A look
    that fails (the store, say) is logged and made again at the next tick: a background rule
    never takes the control plane down with it."""
    if plane.leases is None or not any(True for _ in _looks(plane)):
        return  # no runs (no [leases]), or no class with a bound: nothing to look at
    every = plane.config.wall_clock.check_every_s
    state = Sweep(plane, lambda: plane.leases.clock() if plane.leases else 0.0)
    while True:
        try:
            await state.look()
        except RegistryUnavailable as exc:
            log.warning("wall clock: the look failed (%s); looking again in %g s", exc, every)
        except Exception:
            log.exception("wall clock: the look failed; looking again in %g s", every)
        await anyio.sleep(every)
