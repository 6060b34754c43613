"""Idempotency records in one SQLite file: one gateway whose keys must outlive a restart.

WAL mode with ``synchronous=FULL`` (``haltwire.store.sqlite.SqliteDb``): a ``begin``
that returned is on disk, so a gateway killed mid-call finds the key in flight when it comes
back and answers ``outcome_unknown`` instead of calling again. Each ``begin`` is one
``BEGIN IMMEDIATE`` transaction; expired records are swept now and then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc

from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Begun, IdempotencyUnavailable, Recorded
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import Tables
from haltwire.store.sqlite import SqliteDb

_DDL = """CREATE TABLE IF NOT EXISTS idempotency (
    scope_key   TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    expires_at  REAL NOT NULL,
    outcome     TEXT
)"""
_TABLES = Tables("idempotency", "idempotency store", ("idempotency",), (_DDL,))
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
        self._db: SqliteDb | None = None
        self._opening = anyio.Lock()
        self._begins = 0

    async def connect(self) -> None:
        with _unavailable():
            await self._opened()

    async def _opened(self) -> SqliteDb:
        if self._db is not None:
            return self._db
        async with self._opening:
            if self._db is None:
                self._db = await SqliteDb.open(self.path, _TABLES)
            return self._db

    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        self._begins += 1
        sweep = self._begins % _SWEEP_EVERY == 0
        with _unavailable():
            async with (await self._opened()).write() as tx:
                if sweep:
                    await tx.execute(_SWEEP, (now,))
                row = await tx.one(_GET, (scope_key,))
                if row is None or float(row[1]) <= now:
                    await tx.execute(_CLAIM, (scope_key, fingerprint, now + ttl_s))
                    return FRESH
        if row[0] != fingerprint:
            return CONFLICT
        return IN_FLIGHT if row[2] is None else Recorded(str(row[2]))

    async def complete(self, scope_key: str, outcome: str) -> None:
        with _unavailable():
            async with (await self._opened()).write() as tx:
                await tx.execute(_COMPLETE, (outcome, scope_key))

    async def release(self, scope_key: str) -> None:
        with _unavailable():
            async with (await self._opened()).write() as tx:
                await tx.execute(_RELEASE, (scope_key,))

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        return None  # nothing runs in the background

    async def aclose(self) -> None:
        if self._db is not None:
            await self._db.aclose()


@contextlib.contextmanager
def _unavailable() -> Iterator[None]:
    """The shared plumbing's error, in this store's terms."""
    try:
        yield
    except RegistryUnavailable as exc:
        raise IdempotencyUnavailable(str(exc)) from exc
