"""Idempotency records in one SQLite file: one gateway whose keys must outlive a restart.

WAL mode with ``synchronous=FULL`` (``haltwire.store.sql.SqliteConnection``): a ``begin``
that returned is on disk, so a gateway killed mid-call finds the key in flight when it comes
back and answers ``outcome_unknown`` instead of calling again. Each ``begin`` is one
``BEGIN IMMEDIATE`` transaction; expired records are swept now and then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio

from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Begun, IdempotencyUnavailable, Recorded
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import SqliteConnection, T, immediate

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    scope_key   TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    expires_at  REAL NOT NULL,
    outcome     TEXT
);
"""
_GET = "SELECT fingerprint, expires_at, outcome FROM idempotency WHERE scope_key = ?"
_CLAIM = """
INSERT INTO idempotency (scope_key, fingerprint, expires_at, outcome) VALUES (?, ?, ?, NULL)
ON CONFLICT (scope_key) DO UPDATE
SET fingerprint = excluded.fingerprint, expires_at = excluded.expires_at, outcome = NULL
"""
_COMPLETE = "UPDATE idempotency SET outcome = ? WHERE scope_key = ?"
_RELEASE = "DELETE FROM idempotency WHERE scope_key = ? AND outcome IS NULL"
_SWEEP = "DELETE FROM idempotency WHERE expires_at <= ?"
_SWEEP_EVERY = 4096


class SqliteIdempotency:
    """Opened on first use (or by ``connect`` at start-up, so a bad path fails early)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: SqliteConnection | None = None
        self._opening = anyio.Lock()
        self._begins = 0

    async def connect(self) -> None:
        async with self._opening:
            if self._db is None:
                try:
                    self._db = await SqliteConnection.open(
                        self.path, _SCHEMA, what="idempotency store", store="idempotency"
                    )
                except RegistryUnavailable as exc:
                    raise IdempotencyUnavailable(str(exc)) from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            await self.connect()
        assert self._db is not None
        try:
            return await self._db.run(fn)
        except RegistryUnavailable as exc:  # the shared plumbing's error, in this store's terms
            raise IdempotencyUnavailable(str(exc)) from exc

    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        self._begins += 1
        sweep = self._begins % _SWEEP_EVERY == 0

        def write(conn: sqlite3.Connection) -> Begun:
            with immediate(conn):
                if sweep:
                    conn.execute(_SWEEP, (now,))
                row = conn.execute(_GET, (scope_key,)).fetchone()
                if row is None or float(row[1]) <= now:
                    conn.execute(_CLAIM, (scope_key, fingerprint, now + ttl_s))
                    return FRESH
            if row[0] != fingerprint:
                return CONFLICT
            return IN_FLIGHT if row[2] is None else Recorded(str(row[2]))

        return await self._run(write)

    async def complete(self, scope_key: str, outcome: str) -> None:
        await self._run(lambda conn: conn.execute(_COMPLETE, (outcome, scope_key)))

    async def release(self, scope_key: str) -> None:
        await self._run(lambda conn: conn.execute(_RELEASE, (scope_key,)))

    async def aclose(self) -> None:
        if self._db is not None:
            await self._db.aclose()
