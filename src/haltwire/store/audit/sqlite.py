"""The audit log in one SQLite file: table ``audit``, next to the registry's if the path is shared.

WAL mode with ``synchronous=FULL``, the stdlib ``sqlite3`` in a worker thread, one connection
and one lock, like the registry. Each append is one ``BEGIN IMMEDIATE`` transaction that reads
the latest record and inserts the next, so seq and prev_hash stay consistent even with other
processes appending to the same file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from haltwire.store.audit import COLUMNS, AuditRecord, Outcome, as_row, checked_append, from_row, new_record
from haltwire.store.registry import RegistryUnavailable

T = TypeVar("T")

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
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, path: str | Path) -> SqliteAuditLog:
        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            return cls(await anyio.to_thread.run_sync(connect))
        except sqlite3.Error as exc:
            raise RegistryUnavailable(f"cannot open the audit log at {path}: {exc}") from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:
            conn = self._conn
            if conn is None:
                raise RegistryUnavailable("the audit log is closed")
            try:
                return await anyio.to_thread.run_sync(fn, conn)
            except sqlite3.Error as exc:
                raise RegistryUnavailable(f"audit store failed: {exc}") from exc

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
            conn.execute("BEGIN IMMEDIATE")
            try:
                record = new_record(conn.execute(_LAST).fetchone(), fields, now)
                conn.execute(_INSERT, as_row(record))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return record

        return await self._run(write)

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        query, params = _SELECT, list[object]([since_seq])
        if target is not None:
            query += " AND target = ?"
            params.append(target)
        query += " ORDER BY seq LIMIT ?"
        params.append(-1 if limit is None else max(0, limit))
        rows = await self._run(lambda conn: conn.execute(query, params).fetchall())
        return [from_row(row) for row in rows]

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await anyio.to_thread.run_sync(conn.close)
