"""The registry in PostgreSQL, for several control-plane replicas sharing one history.

Every write transaction first takes a transaction-scoped advisory lock for this registry's
schema, so writers (from any replica) are serialized: revisions are assigned and committed in
the same order, and a reader at revision N never later sees a smaller revision appear.
One connection per registry, guarded by a lock; a broken connection is replaced on next use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg import sql

from haltwire.store.registry import (
    COLUMNS,
    Change,
    RegistryUnavailable,
    StopRecord,
    change,
    checked_clear,
    checked_issue,
    clearable,
    fold,
    issued,
    new_stop_id,
)

T = TypeVar("T")
Conn = psycopg.AsyncConnection[tuple[Any, ...]]

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


class PostgresRegistry:
    """Open with ``await PostgresRegistry.open(url, schema=...)``; the schema is created if missing."""

    def __init__(self, url: str, schema: str, connect_timeout: float, application_name: str) -> None:
        self._url = url
        self._application_name = application_name
        self._schema = schema
        self._timeout = connect_timeout
        self._conn: Conn | None = None
        self._closed = False
        self._lock = anyio.Lock()
        table = sql.Identifier(schema, "changes")
        self._q = {
            name: sql.SQL(text).format(t=table, name=sql.Literal(f"haltwire.registry:{schema}"))
            for name, text in {
                "lock": _LOCK,
                "insert": _INSERT,
                "by_stop": _BY_STOP,
                "active": _ACTIVE,
                "since": _SINCE,
                "latest": _LATEST,
            }.items()
        }

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-registry",
    ) -> PostgresRegistry:
        registry = cls(url, schema, connect_timeout, application_name)

        async def create(conn: Conn) -> None:
            async with conn.transaction():
                await conn.execute(registry._q["lock"])
                await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
                for statement in _SCHEMA.split(";"):
                    await conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, "changes")))

        await registry._run(create)
        return registry

    async def _connection(self) -> Conn:
        if self._closed:
            raise RegistryUnavailable("the registry is closed")
        if self._conn is None or self._conn.broken or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                connect_timeout=max(1, round(self._timeout)),
                application_name=self._application_name,
            )
        return self._conn

    async def _run(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        async with self._lock:
            try:
                with anyio.fail_after(self._timeout * 2):
                    return await fn(await self._connection())
            except (psycopg.Error, OSError, TimeoutError) as exc:
                await self._discard()  # its state is unknown: the next call reconnects
                raise RegistryUnavailable(f"registry store failed: {exc}") from exc

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def _append(self, conn: Conn, fields: tuple[object, ...]) -> int:
        """Append one change with the next revision, inside the caller's locked transaction."""
        cur = await conn.execute(self._q["latest"])
        (latest,) = _one(await cur.fetchone())
        revision = int(latest) + 1
        await conn.execute(self._q["insert"], (revision, *fields))
        return revision

    async def issue_stop(
        self, scope: str, reason: str, issued_by: str, *, now: float, expires_at: float | None = None
    ) -> StopRecord:
        scope = checked_issue(scope, reason, issued_by)
        fields = ("stop", new_stop_id(), scope, reason, issued_by, now, expires_at)

        async def write(conn: Conn) -> StopRecord:
            async with conn.transaction():
                await conn.execute(self._q["lock"])
                revision = await self._append(conn, fields)
            return issued((revision, *fields))

        return await self._run(write)

    async def clear_stop(self, stop_id: str, cleared_by: str, reason: str, *, now: float) -> StopRecord:
        checked_clear(cleared_by, reason)

        async def write(conn: Conn) -> StopRecord:
            async with conn.transaction():
                await conn.execute(self._q["lock"])
                rows = await (await conn.execute(self._q["by_stop"], (stop_id,))).fetchall()
                stop = clearable(rows, stop_id)
                fields = ("clear", stop_id, stop.scope, reason, cleared_by, now, None)
                revision = await self._append(conn, fields)
            cleared = fold([*rows, (revision, *fields)])
            assert cleared is not None
            return cleared

        return await self._run(write)

    async def _fetch(self, name: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._q[name], params)).fetchall()

        return await self._run(read)

    async def active_stops(self, *, now: float) -> list[StopRecord]:
        return [issued(row) for row in await self._fetch("active", (now,))]

    async def get_stop(self, stop_id: str) -> StopRecord | None:
        return fold(await self._fetch("by_stop", (stop_id,)))

    async def changes_since(self, revision: int, *, limit: int = 1000) -> list[Change]:
        n = len(COLUMNS)
        return [change(row[:n], row[n:]) for row in await self._fetch("since", (revision, limit))]

    async def revision(self) -> int:
        (latest,) = _one(next(iter(await self._fetch("latest")), None))
        return int(latest)

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            await self._discard()


def _one(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    if row is None:
        raise RegistryUnavailable("the store answered no row")
    return row
