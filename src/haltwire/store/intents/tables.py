"""Intents over either SQL backend (table ``intents``), shared by every executor and replica.

Each transition reads the row and writes it in one write transaction: in PostgreSQL the read
takes the row ``FOR UPDATE``; in SQLite the transaction already excludes every other writer on
the file. ``claim_next`` is one statement whose subquery takes the oldest pending row (in
PostgreSQL ``FOR UPDATE SKIP LOCKED``): two executors claiming at once never claim one row.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from typing import Any

from haltwire.intents import (
    Created,
    Intent,
    checked,
    claimant,
    decider,
    moved,
    oldest_first,
    over_limit,
    recorded,
)
from haltwire.scope import Scope
from haltwire.store.intents import (
    DDL,
    QUERIES,
    as_row,
    cancel_query,
    claim_query,
    from_row,
    list_query,
    locked_many_query,
    lost_race,
    move_params,
)
from haltwire.store.sql import Params, Store, Tables, Tx


class SqlIntentStore(Store):
    TABLES = Tables("intents", "intent store", ("intents",), DDL)

    async def _rows(self, query: str, params: Params) -> builtins.list[Intent]:
        return [from_row(row) for row in await self._db.all(query, params)]

    async def _written(self, query: str, params: Params) -> builtins.list[Intent]:
        """The rows one writing statement answers, in a write transaction (joined if open)."""
        async with self._db.write() as tx:
            return [from_row(row) for row in await tx.all(query, params)]

    async def create(self, intent: Intent) -> Created:
        async with self._db.write() as tx:
            row = await tx.one(QUERIES["create"], as_row(intent))
            if row is not None:
                return Created(from_row(row), True)
            # ON CONFLICT waited for the first insert to commit, so this statement sees it.
            existing = await tx.one(QUERIES["by_key"], (intent.agent, intent.idempotency_key))
        assert existing is not None
        return recorded(from_row(existing), intent)

    async def get(self, intent_id: str) -> Intent | None:
        return next(iter(await self._rows(QUERIES["get"], (intent_id,))), None)

    async def get_locked(self, intent_id: str) -> Intent | None:
        async with self._db.write() as tx:
            return await self._locked(tx, intent_id)

    async def by_key(self, agent: str, idempotency_key: str) -> Intent | None:
        return next(iter(await self._rows(QUERIES["by_key"], (agent, idempotency_key))), None)

    async def list(
        self, run_id: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> builtins.list[Intent]:
        return await self._rows(*list_query(run_id, states, limit))

    async def count_by_state(self) -> dict[str, int]:
        """How many intents are in each state (for ``/metrics``)."""
        rows = await self._db.all("SELECT state, COUNT(*) FROM intents GROUP BY state", ())
        return {str(state): int(n) for state, n in rows}

    async def claim_next(self, executor: str, now: float) -> Intent | None:
        # One statement: atomic on its own, in either backend.
        rows = await self._written(QUERIES["claim_next"], (claimant(executor), now, now))
        return rows[0] if rows else None

    async def claim_many(self, executor: str, now: float, limit: int) -> builtins.list[Intent]:
        if limit < 1:
            raise ValueError("a claim asks for at least one intent")
        async with self._db.write() as tx:
            ids = [str(row[0]) for row in await tx.all(QUERIES["pending"], (limit,))]
            if not ids:
                return []
            rows = await tx.all(claim_query(ids), (claimant(executor), now, now, *ids))
        return oldest_first([from_row(row) for row in rows])

    async def _locked(self, tx: Tx, intent_id: str) -> Intent | None:
        row = await tx.one(QUERIES["get_locked"], (intent_id,))
        return None if row is None else from_row(row)

    async def get_locked_many(self, intent_ids: Sequence[str]) -> dict[str, Intent]:
        if not intent_ids:
            return {}
        async with self._db.write() as tx:
            rows = await tx.all(locked_many_query(intent_ids), tuple(intent_ids))
        return {intent.intent_id: intent for intent in map(from_row, rows)}

    async def _move(
        self,
        intent_id: str,
        action: str,
        executor: str | None = None,
        current: Intent | None = None,
        **fields: Any,
    ) -> Intent:
        async with self._db.write() as tx:
            if current is None:
                current = await self._locked(tx, intent_id)
            new = moved(current, intent_id, action, executor, **fields)
            assert current is not None
            row = await tx.one(QUERIES["move"], move_params(current, new))
        if row is None:
            raise lost_race(intent_id, action)
        return from_row(row)

    async def commit(
        self, intent_id: str, executor: str, outcome: Any, now: float, current: Intent | None = None
    ) -> Intent:
        return await self._move(intent_id, "commit", claimant(executor), current, outcome=outcome, updated_at=now)

    async def fail(
        self, intent_id: str, executor: str, error: str, now: float, current: Intent | None = None
    ) -> Intent:
        return await self._move(intent_id, "fail", claimant(executor), current, error=error, updated_at=now)

    async def mark_unknown(self, executor: str, now: float) -> builtins.list[Intent]:
        return oldest_first(await self._written(QUERIES["mark_unknown"], (now, claimant(executor))))

    async def check(
        self,
        intent_id: str,
        executor: str,
        revision: int,
        now: float,
        limit: int | None = None,
        current: Intent | None = None,
    ) -> Intent:
        async with self._db.write() as tx:
            if current is None:
                current = await self._locked(tx, intent_id)
            new = checked(current, intent_id, executor, revision, now)
            assert current is not None
            if new is None:
                return current
            if limit is not None and current.run_id is not None:
                # One checker per (run, tool) at a time, so two cannot both pass the count.
                await tx.lock("intent-limit", current.run_id, current.tool)
                counted = await tx.one(QUERIES["checked_in_run"], (current.run_id, current.tool, intent_id))
                refused = over_limit(current, limit, int(counted[0]) if counted else 0)
                if refused is not None:
                    raise refused
            row = await tx.one(QUERIES["move"], move_params(current, new))
        if row is None:
            raise lost_race(intent_id, "check")
        return from_row(row)

    async def cancel_claimed(self, intent_id: str, executor: str, stop_id: str, now: float) -> Intent:
        return await self._move(intent_id, "cancel", claimant(executor), stop_id=stop_id, updated_at=now)

    async def cancel_for_stop(self, scope: Scope, stop_id: str, now: float) -> builtins.list[Intent]:
        # One statement: atomic. A row an executor is claiming or checking meanwhile is
        # re-read after its lock is released: claimed and unchecked, it is cancelled; checked,
        # it is left to settle (the check's row lock orders the two).
        return oldest_first(await self._written(*cancel_query(scope, stop_id, now)))

    async def approve(self, intent_id: str, by: str, now: float) -> Intent:
        return await self._move(intent_id, "approve", decided_by=decider(by), updated_at=now)

    async def reject(self, intent_id: str, by: str, reason: str, now: float) -> Intent:
        return await self._move(
            intent_id, "reject", decided_by=decider(by, reason), decision_reason=reason, updated_at=now
        )
