"""The audit log in one SQLite file: table ``audit``, next to the registry's if the path is shared.

WAL mode with ``synchronous=FULL``, the stdlib ``sqlite3`` in a worker thread, one connection
and one lock, like the registry. Each append is one ``BEGIN IMMEDIATE`` transaction that reads
the latest record and inserts the next, so seq and prev_hash stay consistent even with other
processes appending to the same file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from haltwire.store.audit import COLUMNS, AuditRecord, Outcome, as_row, checked_append, from_row, new_record
from haltwire.store.sql import SqliteConnection, immediate

_COLS = ", ".join(COLUMNS)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq       INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
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
CREATE INDEX IF NOT EXISTS audit_by_target ON audit (target, seq);
"""
_INSERT = f"INSERT INTO audit ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)})"
_LAST = "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
_SELECT = f"SELECT {_COLS} FROM audit WHERE seq > ?"


class SqliteAuditLog:
    def __init__(self, db: SqliteConnection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteAuditLog:
        return cls(await SqliteConnection.open(path, _SCHEMA, what="audit log", store="audit"))

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

        def write(conn: sqlite3.Connection) -> AuditRecord:
            with immediate(conn):
                record = new_record(conn.execute(_LAST).fetchone(), fields, now)
                conn.execute(_INSERT, as_row(record))
            return record

        return await self._db.run(write)

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        query, params = _SELECT, list[object]([since_seq])
        if target is not None:
            query += " AND target = ?"
            params.append(target)
        query += " ORDER BY seq LIMIT ?"
        params.append(-1 if limit is None else max(0, limit))
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [from_row(row) for row in rows]

    async def aclose(self) -> None:
        await self._db.aclose()
