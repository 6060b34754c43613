"""The audit log in PostgreSQL: table ``audit`` in the given schema (the registry's, if shared).

Each append is one transaction that first takes a transaction-scoped advisory lock for this
schema's audit log, so appenders on every replica are serialized: seq and prev_hash are
assigned from the committed tip. One connection guarded by a lock; a broken connection is
replaced on next use. Failures raise ``RegistryUnavailable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg import sql

from haltwire.store.audit import COLUMNS, AuditRecord, Outcome, as_row, checked_append, from_row, new_record
from haltwire.store.sql import PostgresConnection, table_queries

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

    def __init__(self, db: PostgresConnection, queries: dict[str, sql.Composed]) -> None:
        self._db = db
        self._q = queries

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-audit",
    ) -> PostgresAuditLog:
        table = sql.Identifier(schema, "audit")
        queries = table_queries(
            table,
            f"haltwire.audit:{schema}",
            {
                "lock": _LOCK,
                "insert": _INSERT,
                "last": _LAST,
                "select": _SELECT,
                "select_target": _SELECT_TARGET,
            },
        )
        db = await PostgresConnection.open(
            url,
            schema,
            connect_timeout,
            application_name,
            lock_key=queries["lock"],
            ddl=[sql.SQL(statement).format(t=table) for statement in _SCHEMA.split(";")],
            what="audit log",
            store="audit",
        )
        return cls(db, queries)

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

        async with self._db.transaction(self._q["lock"]) as conn:
            last = await (await conn.execute(self._q["last"])).fetchone()
            record = new_record(last, fields, now)
            await conn.execute(self._q["insert"], as_row(record))
        return record

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        bounded = None if limit is None else max(0, limit)
        params: tuple[object, ...]
        if target is None:
            name, params = "select", (since_seq, bounded)
        else:
            name, params = "select_target", (since_seq, target, bounded)

        return [from_row(row) for row in await self._db.fetchall(self._q[name], params)]

    async def aclose(self) -> None:
        await self._db.aclose()
