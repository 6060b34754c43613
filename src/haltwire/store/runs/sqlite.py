"""Runs and checkpoints in the registry's SQLite file (tables ``runs`` and ``checkpoints``).

Its own connection to the file (WAL, ``synchronous=FULL``, one lock), like the audit log's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from haltwire.store.runs import (
    DDL,
    QUERIES,
    Checkpoint,
    RunRecord,
    UnknownRun,
    as_row,
    checkpoint_data,
    checkpoint_from_row,
    ended,
    from_row,
    registered,
)
from haltwire.store.sql import SqliteConnection, immediate

_TABLES = {"runs": "runs", "checkpoints": "checkpoints"}
_SCHEMA = ";\n".join(statement.format(**_TABLES) for statement in DDL) + ";"
_Q = {name: text.format(**_TABLES) for name, text in QUERIES.items()}


class SqliteRunStore:
    def __init__(self, db: SqliteConnection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteRunStore:
        return cls(await SqliteConnection.open(path, _SCHEMA, what="run store", store="runs"))

    async def register(self, run: RunRecord) -> RunRecord:
        def write(conn: sqlite3.Connection) -> RunRecord:
            rows = conn.execute(_Q["register"], as_row(run)).fetchall()
            return registered(rows[0] if rows else None, run)

        return await self._db.run(write)

    async def get(self, run_id: str) -> RunRecord | None:
        row = await self._db.run(lambda conn: conn.execute(_Q["get"], (run_id,)).fetchone())
        return None if row is None else from_row(row)

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        query = f"{_Q['get_many']} ({', '.join('?' for _ in ids)})"
        rows = await self._db.run(lambda conn: conn.execute(query, ids).fetchall())
        return {str(row[0]): from_row(row) for row in rows}

    async def list(self, limit: int = 100) -> list[RunRecord]:
        rows = await self._db.run(lambda conn: conn.execute(_Q["list"], (max(0, limit),)).fetchall())
        return [from_row(row) for row in rows]

    async def end(self, run_id: str, at: float) -> RunRecord:
        rows = await self._db.run(lambda conn: conn.execute(_Q["end"], (at, run_id)).fetchall())
        return ended(rows[0] if rows else None, run_id)

    async def save_checkpoint(self, run_id: str, data: dict[str, Any], at: float) -> Checkpoint:
        text = checkpoint_data(data)

        def write(conn: sqlite3.Connection) -> Checkpoint:
            with immediate(conn):  # the next seq is read and taken in one write transaction
                if conn.execute(_Q["exists"], (run_id,)).fetchone() is None:
                    raise UnknownRun(run_id)
                (seq,) = conn.execute(_Q["next_seq"], (run_id,)).fetchone()
                conn.execute(_Q["save"], (run_id, seq, text, at))
            return checkpoint_from_row((run_id, seq, text, at))

        return await self._db.run(write)

    async def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._db.run(lambda conn: conn.execute(_Q["latest"], (run_id,)).fetchone())
        return None if row is None else checkpoint_from_row(row)

    async def aclose(self) -> None:
        await self._db.aclose()
