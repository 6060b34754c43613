"""The registry over either SQL backend: revisions are assigned inside one write transaction.

Every write transaction first takes the registry's lock (in PostgreSQL, an advisory lock for
this schema; in SQLite, the file's write lock), so writers in every process are serialized:
revisions are assigned and committed in the same order, and a reader at revision N never
later sees a smaller revision appear.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from haltwire.stops import Change, StopRecord
from haltwire.store.registry import (
    COLUMNS,
    DDL,
    QUERIES,
    RegistryUnavailable,
    RequestConflict,
    by_ids_query,
    change,
    checked_clear,
    checked_issue,
    clearable,
    digest,
    during_query,
    fold,
    fold_all,
    issued,
    new_stop_id,
)
from haltwire.store.sql import Row, Store, Tables, Tx


class SqlRegistry(Store):
    TABLES = Tables("registry", "registry", ("changes", "requests"), DDL)

    async def _append(self, tx: Tx, fields: tuple[object, ...]) -> int:
        """Append one change with the next revision, inside the caller's write transaction."""
        revision = _latest(await tx.one(QUERIES["latest"])) + 1
        await tx.execute(QUERIES["insert"], (revision, *fields))
        await tx.notify(str(revision))
        return revision

    async def issue_stop(
        self, scope: str, reason: str, issued_by: str, *, now: float, expires_at: float | None = None
    ) -> StopRecord:
        scope = checked_issue(scope, reason, issued_by)
        fields = ("stop", new_stop_id(), scope, reason, issued_by, now, expires_at)
        async with self._db.write("registry") as tx:
            revision = await self._append(tx, fields)
        return issued((revision, *fields))

    async def clear_stop(self, stop_id: str, cleared_by: str, reason: str, *, now: float) -> StopRecord:
        checked_clear(cleared_by, reason)
        async with self._db.write("registry") as tx:
            rows = await tx.all(QUERIES["by_stop"], (stop_id,))
            stop = clearable(rows, stop_id)
            fields = ("clear", stop_id, stop.scope, reason, cleared_by, now, None)
            revision = await self._append(tx, fields)
        cleared = fold([*rows, (revision, *fields)])
        assert cleared is not None
        return cleared

    async def active_stops(self, *, now: float) -> list[StopRecord]:
        return [issued(row) for row in await self._db.all(QUERIES["active"], (now,))]

    async def get_stop(self, stop_id: str) -> StopRecord | None:
        return fold(await self._db.all(QUERIES["by_stop"], (stop_id,)))

    async def all_stops(self) -> list[StopRecord]:
        return fold_all(await self._db.all(QUERIES["all"]))

    async def stops_during(
        self, scopes: Collection[str], since: float, until: float | None
    ) -> list[StopRecord]:
        if not scopes:
            return []
        params = [*scopes, *([] if until is None else [until]), since, since]
        rows = await self._db.all(during_query(len(scopes), until is not None), params)
        return fold_all(rows)

    async def stops_by_id(self, stop_ids: Collection[str]) -> list[StopRecord]:
        ids = sorted(set(stop_ids))
        if not ids:
            return []
        stops = fold_all(await self._db.all(by_ids_query(len(ids)), ids))
        return sorted(stops, key=lambda s: s.revision)

    async def changes_since(self, revision: int, *, limit: int = 1000) -> list[Change]:
        n = len(COLUMNS)
        return [change(row[:n], row[n:]) for row in await self._db.all(QUERIES["since"], (revision, limit))]

    async def revision(self) -> int:
        return _latest(await self._db.one(QUERIES["latest"]))

    async def digests(self, after: int, limit: int) -> list[tuple[int, str]]:
        return [(int(row[0]), digest(row)) for row in await self._db.all(QUERIES["page"], (after, limit))]

    async def requested(self, actor: str, key: str, fingerprint: str) -> str | None:
        async with self._db.write("registry") as tx:
            row = await tx.one(QUERIES["requested"], (actor, key))
        if row is None:
            return None
        if row[0] != fingerprint:
            raise RequestConflict(f"the request key {key!r} was used before for another request")
        return str(row[1])

    async def remember(self, actor: str, key: str, fingerprint: str, stop_id: str) -> None:
        async with self._db.write("registry") as tx:
            await tx.execute(QUERIES["remember"], (actor, key, fingerprint, stop_id))

    async def follow_writes(self, on_change: Callable[[], None]) -> None:
        await self._db.follow(on_change)


def _latest(row: Row | None) -> int:
    if row is None:
        raise RegistryUnavailable("the store answered no row")
    return int(row[0])
