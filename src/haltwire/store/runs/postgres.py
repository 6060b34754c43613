"""Runs and checkpoints in the registry's PostgreSQL schema (tables ``runs`` and ``checkpoints``).

Shared by every control-plane replica. Saving a checkpoint takes a transaction-scoped
advisory lock for this schema's checkpoints, so two replicas never hand out one seq twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

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
from haltwire.store.sql import PostgresConnection, SharedQueries, advisory_lock

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


class PostgresRunStore:
    """Open with ``await PostgresRunStore.open(url, schema=...)``; the tables are created if missing."""

    def __init__(self, db: PostgresConnection, shared: SharedQueries) -> None:
        self._db = db
        self._q = shared.bind_all(QUERIES)
        self._q["get_any"] = shared.bind(QUERIES["get_many"] + " (SELECT unnest(?::text[]))")
        self._q["lock"] = advisory_lock(f"haltwire.checkpoints:{shared.schema}")

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-runs",
    ) -> PostgresRunStore:
        tables = {
            "runs": sql.Identifier(schema, "runs"),
            "checkpoints": sql.Identifier(schema, "checkpoints"),
        }
        shared = SharedQueries(schema, tables)
        db = await shared.connect(
            url, connect_timeout, application_name, ddl=DDL, what="run store", store="runs"
        )
        return cls(db, shared)

    async def _one(self, name: str, params: tuple[object, ...]) -> tuple[Any, ...] | None:
        return next(iter(await self._db.fetchall(self._q[name], params)), None)

    async def register(self, run: RunRecord) -> RunRecord:
        return registered(await self._one("register", as_row(run)), run)

    async def get(self, run_id: str) -> RunRecord | None:
        row = await self._one("get", (run_id,))
        return None if row is None else from_row(row)

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        if not run_ids:
            return {}
        rows = await self._db.fetchall(self._q["get_any"], (list(run_ids),))
        return {str(row[0]): from_row(row) for row in rows}

    async def list(self, limit: int = 100) -> list[RunRecord]:
        return [from_row(row) for row in await self._db.fetchall(self._q["list"], (max(0, limit),))]

    async def end(self, run_id: str, at: float) -> RunRecord:
        return ended(await self._one("end", (at, run_id)), run_id)

    async def save_checkpoint(self, run_id: str, data: dict[str, Any], at: float) -> Checkpoint:
        text = checkpoint_data(data)
        async with self._db.transaction(self._q["lock"]) as conn:
            if await (await conn.execute(self._q["exists"], (run_id,))).fetchone() is None:
                raise UnknownRun(run_id)
            row = await (await conn.execute(self._q["next_seq"], (run_id,))).fetchone()
            seq = int(row[0]) if row is not None else 1
            await conn.execute(self._q["save"], (run_id, seq, text, at))
        return checkpoint_from_row((run_id, seq, text, at))

    async def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._one("latest", (run_id,))
        return None if row is None else checkpoint_from_row(row)

    async def aclose(self) -> None:
        await self._db.aclose()
