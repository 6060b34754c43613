"""The registry in PostgreSQL, for several control-plane replicas sharing one history.

Every write transaction first takes a transaction-scoped advisory lock for this registry's
schema, so writers (from any replica) are serialized: revisions are assigned and committed in
the same order, and a reader at revision N never later sees a smaller revision appear.
One connection per registry (``haltwire.store.sql.PostgresConnection``), guarded by a lock; a
broken connection is replaced on next use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import sql

from haltwire.stops import Change, StopRecord
from haltwire.store.registry import (
    COLUMNS,
    RegistryUnavailable,
    change,
    checked_clear,
    checked_issue,
    clearable,
    fold,
    fold_all,
    issued,
    new_stop_id,
)
from haltwire.store.sql import PgConn as Conn
from haltwire.store.sql import PostgresConnection, table_queries

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"

_COLS = ", ".join(COLUMNS)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    revision   BIGINT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('stop', 'clear')),
    stop_id    TEXT NOT NULL,
    scope      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    at         DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
);
CREATE UNIQUE INDEX IF NOT EXISTS changes_one_kind_per_stop ON {t} (stop_id, kind)
"""
_LOCK = "SELECT pg_advisory_xact_lock(hashtext({name}))"
_INSERT = f"INSERT INTO {{t}} ({_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
_BY_STOP = f"SELECT {_COLS} FROM {{t}} WHERE stop_id = %s ORDER BY revision"
_ACTIVE = f"""
SELECT {_COLS} FROM {{t}} AS s
WHERE s.kind = 'stop' AND (s.expires_at IS NULL OR s.expires_at > %s)
  AND NOT EXISTS (SELECT 1 FROM {{t}} AS c WHERE c.stop_id = s.stop_id AND c.kind = 'clear')
ORDER BY s.revision
"""
_SINCE = f"""
SELECT {", ".join("c." + c for c in COLUMNS)}, {", ".join("s." + c for c in COLUMNS)}
FROM {{t}} AS c JOIN {{t}} AS s ON s.stop_id = c.stop_id AND s.kind = 'stop'
WHERE c.revision > %s ORDER BY c.revision LIMIT %s
"""
_LATEST = "SELECT COALESCE(MAX(revision), 0) FROM {t}"
_ALL = f"SELECT {_COLS} FROM {{t}} ORDER BY revision"
# Delivered to every LISTENing replica when the writing transaction commits.
_NOTIFY = "SELECT pg_notify({channel}, %s)"


class PostgresRegistry:
    """Open with ``await PostgresRegistry.open(url, schema=...)``; the schema is created if missing."""

    def __init__(self, db: PostgresConnection, queries: dict[str, sql.Composed], channel: str) -> None:
        self._db = db
        self._q = queries
        self._channel = channel

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-registry",
    ) -> PostgresRegistry:
        table = sql.Identifier(schema, "changes")
        channel = notify_channel(schema)
        queries = table_queries(
            table,
            f"haltwire.registry:{schema}",
            {
                "lock": _LOCK,
                "insert": _INSERT,
                "by_stop": _BY_STOP,
                "active": _ACTIVE,
                "since": _SINCE,
                "latest": _LATEST,
                "all": _ALL,
            },
        )
        queries["notify"] = sql.SQL(_NOTIFY).format(channel=sql.Literal(channel))
        db = await PostgresConnection.open(
            url,
            schema,
            connect_timeout,
            application_name,
            lock_key=queries["lock"],
            ddl=[sql.SQL(statement).format(t=table) for statement in _SCHEMA.split(";")],
            what="registry",
            store="registry",
        )
        return cls(db, queries, channel)

    async def _append(self, conn: Conn, fields: tuple[object, ...]) -> int:
        """Append one change with the next revision, inside the caller's locked transaction."""
        cur = await conn.execute(self._q["latest"])
        (latest,) = _one(await cur.fetchone())
        revision = int(latest) + 1
        await conn.execute(self._q["insert"], (revision, *fields))
        await conn.execute(self._q["notify"], (str(revision),))
        return revision

    async def issue_stop(
        self, scope: str, reason: str, issued_by: str, *, now: float, expires_at: float | None = None
    ) -> StopRecord:
        scope = checked_issue(scope, reason, issued_by)
        fields = ("stop", new_stop_id(), scope, reason, issued_by, now, expires_at)

        async with self._db.transaction(self._q["lock"]) as conn:
            revision = await self._append(conn, fields)
        return issued((revision, *fields))

    async def clear_stop(self, stop_id: str, cleared_by: str, reason: str, *, now: float) -> StopRecord:
        checked_clear(cleared_by, reason)

        async with self._db.transaction(self._q["lock"]) as conn:
            rows = await (await conn.execute(self._q["by_stop"], (stop_id,))).fetchall()
            stop = clearable(rows, stop_id)
            fields = ("clear", stop_id, stop.scope, reason, cleared_by, now, None)
            revision = await self._append(conn, fields)
        cleared = fold([*rows, (revision, *fields)])
        assert cleared is not None
        return cleared

    async def _fetch(self, name: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        return await self._db.fetchall(self._q[name], params)

    async def active_stops(self, *, now: float) -> list[StopRecord]:
        return [issued(row) for row in await self._fetch("active", (now,))]

    async def get_stop(self, stop_id: str) -> StopRecord | None:
        return fold(await self._fetch("by_stop", (stop_id,)))

    async def all_stops(self) -> list[StopRecord]:
        return fold_all(await self._fetch("all"))

    async def changes_since(self, revision: int, *, limit: int = 1000) -> list[Change]:
        n = len(COLUMNS)
        return [change(row[:n], row[n:]) for row in await self._fetch("since", (revision, limit))]

    async def revision(self) -> int:
        (latest,) = _one(next(iter(await self._fetch("latest")), None))
        return int(latest)

    async def follow_writes(self, on_change: Callable[[], None]) -> None:
        await self._db.listen(self._channel, on_change)

    async def aclose(self) -> None:
        await self._db.aclose()


def notify_channel(schema: str) -> str:
    """The NOTIFY channel of the registry in ``schema`` (identifiers stop at 63 bytes)."""
    return f"haltwire_registry_{schema}"[:63]


def _one(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    if row is None:
        raise RegistryUnavailable("the store answered no row")
    return row
