"""The audit log in PostgreSQL: table ``audit`` in the given schema (the registry's, if shared).

Each append is one transaction that first takes a transaction-scoped advisory lock for this
schema's audit log, so appenders on every replica are serialized: seq and prev_hash are
assigned from the committed tip. One connection guarded by a lock; a broken connection is
replaced on next use. Failures raise ``RegistryUnavailable``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg import sql

from haltwire.store.audit import COLUMNS, AuditRecord, Outcome, as_row, checked_append, from_row, new_record
from haltwire.store.registry import RegistryUnavailable

T = TypeVar("T")
Conn = psycopg.AsyncConnection[tuple[Any, ...]]

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"

_COLS = ", ".join(COLUMNS)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS {t} (
    seq       BIGINT PRIMARY KEY,
    at        DOUBLE PRECISION NOT NULL,
    actor     TEXT NOT NULL,
    role      TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    outcome   TEXT NOT NULL CHECK (outcome IN ('ok', 'refused')),
    reason    TEXT NOT NULL,
    detail    TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_target ON {t} (target, seq)
"""
_LOCK = "SELECT pg_advisory_xact_lock(hashtext({name}))"
_INSERT = f"INSERT INTO {{t}} ({_COLS}) VALUES ({', '.join('%s' for _ in COLUMNS)})"
_LAST = "SELECT seq, hash FROM {t} ORDER BY seq DESC LIMIT 1"
_SELECT = f"SELECT {_COLS} FROM {{t}} WHERE seq > %s ORDER BY seq LIMIT %s"
_SELECT_TARGET = f"SELECT {_COLS} FROM {{t}} WHERE seq > %s AND target = %s ORDER BY seq LIMIT %s"


class PostgresAuditLog:
    """Open with ``await PostgresAuditLog.open(url, schema=...)``; the table is created if missing."""

    def __init__(self, url: str, schema: str, connect_timeout: float, application_name: str) -> None:
        self._url = url
        self._application_name = application_name
        self._timeout = connect_timeout
        self._conn: Conn | None = None
        self._closed = False
        self._lock = anyio.Lock()
        table = sql.Identifier(schema, "audit")
        self._q = {
            name: sql.SQL(text).format(t=table, name=sql.Literal(f"haltwire.audit:{schema}"))
            for name, text in {
                "lock": _LOCK,
                "insert": _INSERT,
                "last": _LAST,
                "select": _SELECT,
                "select_target": _SELECT_TARGET,
            }.items()
        }

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-audit",
    ) -> PostgresAuditLog:
        log = cls(url, schema, connect_timeout, application_name)

        async def create(conn: Conn) -> None:
            async with conn.transaction():
                await conn.execute(log._q["lock"])
                await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
                for statement in _SCHEMA.split(";"):
                    await conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, "audit")))

        await log._run(create)
        return log

    async def _connection(self) -> Conn:
        if self._closed:
            raise RegistryUnavailable("the audit log is closed")
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
                raise RegistryUnavailable(f"audit store failed: {exc}") from exc

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def append(
        self,
        actor: str,
        role: str,
        action: str,
        target: str,
        outcome: Outcome,
        reason: str,
        detail: Mapping[str, Any],
        *,
        now: float,
    ) -> AuditRecord:
        outcome = checked_append(actor, action, outcome, detail, now)
        fields = (actor, role, action, target, outcome, reason, detail)

        async def write(conn: Conn) -> AuditRecord:
            async with conn.transaction():
                await conn.execute(self._q["lock"])
                last = await (await conn.execute(self._q["last"])).fetchone()
                record = new_record(last, fields, now)
                await conn.execute(self._q["insert"], as_row(record))
            return record

        return await self._run(write)

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        bounded = None if limit is None else max(0, limit)
        params: tuple[object, ...]
        if target is None:
            name, params = "select", (since_seq, bounded)
        else:
            name, params = "select_target", (since_seq, target, bounded)

        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._q[name], params)).fetchall()

        return [from_row(row) for row in await self._run(read)]

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            await self._discard()
