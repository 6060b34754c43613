"""What the whole-run rules decided, over either SQL backend (tables ``escalations`` and
``overdue_runs``; the queries read ``changes`` and ``runs`` too)."""

from __future__ import annotations

from collections.abc import Sequence

from haltwire.store.runs import RunRecord, from_row
from haltwire.store.sql import Store, Tables
from haltwire.store.trips import (
    DDL,
    QUERIES,
    Group,
    Trip,
    causes_text,
    overdue_query,
    trip_of,
    trips_query,
)


class SqlTripStore(Store):
    TABLES = Tables("trips", "trip store", ("escalations", "overdue_runs"), DDL)

    async def trips(self, actors: Sequence[str], group: Group, after: float) -> list[Trip]:
        if not actors:
            return []
        text, params = trips_query(actors, group, after)
        return [trip_of(row) for row in await self._db.all(text, params)]

    async def last_escalation(self, rule: str, scope: str) -> float | None:
        row = await self._db.one(QUERIES["last"], (rule, scope))
        return None if row is None or row[0] is None else float(row[0])

    async def active_stop_on(self, scope: str, now: float) -> str | None:
        row = await self._db.one(QUERIES["active_on"], (scope, now))
        return None if row is None else str(row[0])

    async def record_escalation(
        self, rule: str, scope: str, at: float, mode: str, stop_id: str | None, causes: Sequence[str]
    ) -> None:
        async with self._db.write() as tx:
            await tx.execute(QUERIES["escalated"], (rule, scope, at, mode, stop_id, causes_text(causes)))

    async def overdue(
        self, after: float, up_to: float, classes: Sequence[str], other_than: bool, limit: int
    ) -> list[RunRecord]:
        text, params = overdue_query(after, up_to, classes, other_than, limit)
        return [from_row(row) for row in await self._db.all(text, params)]

    async def mark_overdue(self, run_id: str, at: float, mode: str, stop_id: str | None) -> bool:
        async with self._db.write() as tx:
            return await tx.one(QUERIES["mark"], (run_id, at, mode, stop_id)) is not None

    async def is_overdue(self, run_id: str) -> bool:
        return await self._db.one(QUERIES["is_overdue"], (run_id,)) is not None
