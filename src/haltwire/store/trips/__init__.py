"""What the control plane's whole-run rules decided: escalations, and runs past their wall clock.

Two tables beside the registry (the same SQLite file, the same PostgreSQL schema), written in the
transaction of the stop they explain, so a rule's decision and its stop commit together or not
at all:

- ``escalations``: each time an ``[[escalations]]`` rule fired (enforced: the stop it wrote; in
  shadow: none), on which scope and because of which stops. A rule counts only trips after its
  last firing on a scope, so the trips that caused one escalation never cause a second.
- ``overdue_runs``: each run the wall-clock rule stopped (or, in shadow, would have), once
  (``ON CONFLICT DO NOTHING``), so that no later look at it stops it again.

The queries also read the registry's ``changes`` and the run store's ``runs``: the store is
opened with them, on one ``Db`` (``haltwire.control.stores``). The DDL and the queries are
written once here; ``tables.SqlTripStore`` runs them on either backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.runs import COLUMNS as RUN_COLUMNS
from haltwire.store.runs import RunRecord

Row = Sequence[Any]


@dataclass(frozen=True, slots=True)
class Trip:
    """A tripwire stop of a run: the stop, when it was issued, and the run's identity."""

    stop_id: str
    at: float
    run_id: str
    tenant: str
    agent: str
    version: str


@dataclass(frozen=True, slots=True)
class Group:
    """Which trips count together: those of one tenant, one agent version, one agent, or all."""

    tenant: str | None = None
    agent: str | None = None
    version: str | None = None


class TripStore(Protocol):
    async def trips(self, actors: Sequence[str], group: Group, after: float) -> list[Trip]:
        """The ``run:`` stops issued by ``actors`` after ``after`` (Unix time), not cleared, of
        registered runs in ``group``, oldest first."""
        ...

    async def last_escalation(self, rule: str, scope: str) -> float | None:
        """When ``rule`` last fired on ``scope`` (either mode), or None."""
        ...

    async def active_stop_on(self, scope: str, now: float) -> str | None:
        """The id of an active stop on exactly ``scope``, or None."""
        ...

    async def record_escalation(
        self, rule: str, scope: str, at: float, mode: str, stop_id: str | None, causes: Sequence[str]
    ) -> None: ...

    async def overdue(
        self, after: float, up_to: float, classes: Sequence[str], other_than: bool, limit: int
    ) -> list[RunRecord]:
        """Runs not ended and not yet marked overdue, registered after ``after`` and at most at
        ``up_to``, of the agent classes ``classes`` (``other_than``: of any class but those),
        oldest first."""
        ...

    async def mark_overdue(self, run_id: str, at: float, mode: str, stop_id: str | None) -> bool:
        """Mark the run overdue (``stop_id``: the stop the rule wrote for it); False when it was
        already (by another replica, say)."""
        ...

    async def is_overdue(self, run_id: str) -> bool:
        """Whether the run was marked overdue."""
        ...


# -- shared by the backends -------------------------------------------------------------------

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {escalations} (
    rule    TEXT NOT NULL,
    scope   TEXT NOT NULL,
    at      DOUBLE PRECISION NOT NULL,
    mode    TEXT NOT NULL,
    stop_id TEXT,
    causes  TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS escalations_by_rule ON {escalations} (rule, scope, at)",
    """CREATE TABLE IF NOT EXISTS {overdue_runs} (
    run_id  TEXT PRIMARY KEY,
    at      DOUBLE PRECISION NOT NULL,
    mode    TEXT NOT NULL,
    stop_id TEXT
)""",
)

_RUN_COLS = ", ".join(f"r.{c}" for c in RUN_COLUMNS)
_NOT_CLEARED = "NOT EXISTS (SELECT 1 FROM {changes} AS c WHERE c.stop_id = s.stop_id AND c.kind = 'clear')"

QUERIES: Final = {
    # Completed by ``trips_query``: the actors, the group.
    "trips": "SELECT s.stop_id, s.at, r.run_id, r.tenant, r.agent, r.version "
    "FROM {changes} AS s JOIN {runs} AS r ON r.run_id = substr(s.scope, 5) "
    f"WHERE s.kind = 'stop' AND s.at > ? AND substr(s.scope, 1, 4) = 'run:' AND {_NOT_CLEARED}",
    "last": "SELECT MAX(at) FROM {escalations} WHERE rule = ? AND scope = ?",
    "active_on": "SELECT s.stop_id FROM {changes} AS s WHERE s.kind = 'stop' AND s.scope = ? "
    f"AND (s.expires_at IS NULL OR s.expires_at > ?) AND {_NOT_CLEARED} ORDER BY s.revision LIMIT 1",
    "escalated": "INSERT INTO {escalations} (rule, scope, at, mode, stop_id, causes) VALUES (?, ?, ?, ?, ?, ?)",
    # Completed by ``overdue_query``: the classes.
    "overdue": f"SELECT {_RUN_COLS} FROM {{runs}} AS r WHERE r.ended_at IS NULL "
    "AND r.registered_at > ? AND r.registered_at <= ? "
    "AND NOT EXISTS (SELECT 1 FROM {overdue_runs} AS o WHERE o.run_id = r.run_id)",
    "mark": "INSERT INTO {overdue_runs} (run_id, at, mode, stop_id) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
    "is_overdue": "SELECT 1 FROM {overdue_runs} WHERE run_id = ?",
}


def placeholders(values: Sequence[object]) -> str:
    return f"({', '.join('?' for _ in values)})"


def trips_query(actors: Sequence[str], group: Group, after: float) -> tuple[str, list[object]]:
    text, params = QUERIES["trips"], list[object]([after])
    text += f" AND s.actor IN {placeholders(actors)}"
    params += list(actors)
    for column in ("tenant", "agent", "version"):
        value = getattr(group, column)
        if value is not None:
            text += f" AND r.{column} = ?"
            params.append(value)
    return text + " ORDER BY s.revision", params


def overdue_query(
    after: float, up_to: float, classes: Sequence[str], other_than: bool, limit: int
) -> tuple[str, list[object]]:
    text, params = QUERIES["overdue"], list[object]([after, up_to])
    if classes:
        text += f" AND r.agent_class {'NOT IN' if other_than else 'IN'} {placeholders(classes)}"
        params += list(classes)
    elif not other_than:
        raise ValueError("name at least one agent class")
    return text + " ORDER BY r.registered_at, r.run_id LIMIT ?", [*params, limit]


def trip_of(row: Row) -> Trip:
    stop_id, at, run_id, tenant, agent, version = row
    return Trip(str(stop_id), float(at), str(run_id), str(tenant), str(agent), str(version))


def causes_text(causes: Sequence[str]) -> str:
    return json.dumps(list(causes), separators=(",", ":"))


__all__ = ["Group", "RegistryUnavailable", "Trip", "TripStore"]
