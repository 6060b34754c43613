"""The registry in one SQLite file: the embedded default.

WAL mode with ``synchronous=FULL``: a write that returned is on disk and survives the process
being killed (and the machine losing power). The stdlib ``sqlite3`` runs in a worker thread;
one connection, one lock, so writes are serialized and revisions follow commit order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio

from haltwire.stops import Change, StopRecord
from haltwire.store.registry import (
    COLUMNS,
    change,
    checked_clear,
    checked_issue,
    clearable,
    fold,
    fold_all,
    issued,
    new_stop_id,
)
from haltwire.store.sql import SqliteConnection, immediate

_COLS = ", ".join(COLUMNS)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS changes (
    revision   INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('stop', 'clear')),
    stop_id    TEXT NOT NULL,
    scope      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    at         REAL NOT NULL,
    expires_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS changes_one_kind_per_stop ON changes (stop_id, kind);
"""
_INSERT = f"INSERT INTO changes ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_BY_STOP = f"SELECT {_COLS} FROM changes WHERE stop_id = ? ORDER BY revision"
_ACTIVE = f"""
SELECT {_COLS} FROM changes AS s
WHERE s.kind = 'stop' AND (s.expires_at IS NULL OR s.expires_at > ?)
  AND NOT EXISTS (SELECT 1 FROM changes AS c WHERE c.stop_id = s.stop_id AND c.kind = 'clear')
ORDER BY s.revision
"""
_SINCE = f"""
SELECT {", ".join("c." + c for c in COLUMNS)}, {", ".join("s." + c for c in COLUMNS)}
FROM changes AS c JOIN changes AS s ON s.stop_id = c.stop_id AND s.kind = 'stop'
WHERE c.revision > ? ORDER BY c.revision LIMIT ?
"""
_LATEST = "SELECT COALESCE(MAX(revision), 0) FROM changes"
_ALL = f"SELECT {_COLS} FROM changes ORDER BY revision"


class SqliteRegistry:
    def __init__(self, db: SqliteConnection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteRegistry:
        return cls(await SqliteConnection.open(path, _SCHEMA, what="registry", store="registry"))

    @staticmethod
    def _append(conn: sqlite3.Connection, row_after_revision: tuple[object, ...]) -> int:
        """Append one change with the next revision; the caller holds the write transaction."""
        (latest,) = conn.execute(_LATEST).fetchone()
        revision = int(latest) + 1
        conn.execute(_INSERT, (revision, *row_after_revision))
        return revision

    async def issue_stop(
        self, scope: str, reason: str, issued_by: str, *, now: float, expires_at: float | None = None
    ) -> StopRecord:
        scope = checked_issue(scope, reason, issued_by)
        stop_id = new_stop_id()
        fields = ("stop", stop_id, scope, reason, issued_by, now, expires_at)

        def write(conn: sqlite3.Connection) -> StopRecord:
            with immediate(conn):
                revision = self._append(conn, fields)
            return issued((revision, *fields))

        return await self._db.run(write)

    async def clear_stop(self, stop_id: str, cleared_by: str, reason: str, *, now: float) -> StopRecord:
        checked_clear(cleared_by, reason)

        def write(conn: sqlite3.Connection) -> StopRecord:
            with immediate(conn):
                rows = conn.execute(_BY_STOP, (stop_id,)).fetchall()
                stop = clearable(rows, stop_id)
                fields = ("clear", stop_id, stop.scope, reason, cleared_by, now, None)
                revision = self._append(conn, fields)
            cleared = fold([*rows, (revision, *fields)])
            assert cleared is not None
            return cleared

        return await self._db.run(write)

    async def active_stops(self, *, now: float) -> list[StopRecord]:
        rows = await self._db.run(lambda conn: conn.execute(_ACTIVE, (now,)).fetchall())
        return [issued(row) for row in rows]

    async def get_stop(self, stop_id: str) -> StopRecord | None:
        rows = await self._db.run(lambda conn: conn.execute(_BY_STOP, (stop_id,)).fetchall())
        return fold(rows)

    async def all_stops(self) -> list[StopRecord]:
        return fold_all(await self._db.run(lambda conn: conn.execute(_ALL).fetchall()))

    async def changes_since(self, revision: int, *, limit: int = 1000) -> list[Change]:
        rows = await self._db.run(lambda conn: conn.execute(_SINCE, (revision, limit)).fetchall())
        n = len(COLUMNS)
        return [change(row[:n], row[n:]) for row in rows]

    async def revision(self) -> int:
        (latest,) = await self._db.run(lambda conn: conn.execute(_LATEST).fetchone())
        return int(latest)

    async def follow_writes(self, on_change: Callable[[], None]) -> None:
        # One control plane per file: every write is its own and wakes the watchers directly.
        # Anything else writing the file is picked up by the watch's heartbeat-period re-read.
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        await self._db.aclose()
