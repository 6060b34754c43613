"""Runs and checkpoints over either SQL backend (tables ``runs`` and ``checkpoints``).

Saving a checkpoint reads the next seq and takes it in one write transaction under the
checkpoints' lock (in PostgreSQL, an advisory lock for this schema; in SQLite, the file's
write lock), so two writers never hand out one seq twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haltwire.store.runs import (
    DDL,
    GRANTS_PER_STATEMENT,
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
from haltwire.store.sql import Params, Store, Tables


class SqlRunStore(Store):
    TABLES = Tables("runs", "run store", ("runs", "checkpoints", "lease_grants"), DDL)

    def _any_of(self, run_ids: list[str]) -> tuple[str, Params]:
        """The end of the ``get_many`` query for ``run_ids`` and its parameters: per backend."""
        raise NotImplementedError

    async def register(self, run: RunRecord) -> RunRecord:
        async with self._db.write() as tx:
            return registered(await tx.one(QUERIES["register"], as_row(run)), run)

    async def get(self, run_id: str) -> RunRecord | None:
        row = await self._db.one(QUERIES["get"], (run_id,))
        return None if row is None else from_row(row)

    async def get_many(self, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        tail, params = self._any_of(ids)
        rows = await self._db.all(f"{QUERIES['get_many']} {tail}", params)
        return {str(row[0]): from_row(row) for row in rows}

    async def list(self, limit: int = 100) -> list[RunRecord]:
        return [from_row(row) for row in await self._db.all(QUERIES["list"], (max(0, limit),))]

    async def end(self, run_id: str, at: float) -> RunRecord:
        async with self._db.write() as tx:
            return ended(await tx.one(QUERIES["end"], (at, run_id)), run_id)

    async def save_checkpoint(self, run_id: str, data: dict[str, Any], at: float) -> Checkpoint:
        text = checkpoint_data(data)
        async with self._db.write("checkpoints") as tx:
            if await tx.one(QUERIES["exists"], (run_id,)) is None:
                raise UnknownRun(run_id)
            row = await tx.one(QUERIES["next_seq"], (run_id,))
            seq = int(row[0]) if row is not None else 1
            await tx.execute(QUERIES["save"], (run_id, seq, text, at))
        return checkpoint_from_row((run_id, seq, text, at))

    async def note_grants(self, grants: dict[str, tuple[float, float]]) -> None:
        items = list(grants.items())
        for start in range(0, len(items), GRANTS_PER_STATEMENT):
            batch = items[start : start + GRANTS_PER_STATEMENT]
            values = ", ".join("(?, ?, ?)" for _ in batch)
            params = [v for run_id, (at, expires) in batch for v in (run_id, at, expires)]
            # A transaction per statement: a stop waits for one short write, never the whole batch.
            async with self._db.write() as tx:
                await tx.execute(f"{QUERIES['note_grants']} {values} {QUERIES['note_grants_tail']}", params)

    async def grants(self, run_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        tail, params = self._any_of(ids)
        rows = await self._db.all(f"{QUERIES['grants']} {tail}", params)
        return {str(row[0]): (float(row[1]), float(row[2])) for row in rows}

    async def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._db.one(QUERIES["latest"], (run_id,))
        return None if row is None else checkpoint_from_row(row)
