"""Intents in the registry's PostgreSQL schema (table ``intents``), shared by every replica.

Each transition reads the row ``FOR UPDATE`` and writes it in one transaction. ``claim_next``
is one statement whose subquery takes the oldest pending row ``FOR UPDATE SKIP LOCKED``: two
executors (two connections) claiming at once lock different rows, never one row twice.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Any

from psycopg import sql

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
    from_row,
    list_query,
    lost_race,
    move_params,
)
from haltwire.store.sql import PgConn, PostgresConnection, SharedQueries, advisory_lock

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


class PostgresIntentStore:
    """Open with ``await PostgresIntentStore.open(url, schema=...)``; the table is created if missing."""

    def __init__(self, db: PostgresConnection, shared: SharedQueries) -> None:
        self._db = db
        self._shared = shared
        self._q = shared.bind_all(QUERIES)

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-intents",
    ) -> PostgresIntentStore:
        names = {
            "intents": sql.Identifier(schema, "intents"),
            "lock": sql.SQL("FOR UPDATE"),
            "skip": sql.SQL("FOR UPDATE SKIP LOCKED"),
        }
        shared = SharedQueries(schema, names)
        db = await shared.connect(
            url, connect_timeout, application_name, ddl=DDL, what="intent store", store="intents"
        )
        return cls(db, shared)

    async def _rows(
        self, query: sql.Composed, params: tuple[object, ...] | list[object]
    ) -> builtins.list[Intent]:
        return [from_row(row) for row in await self._db.fetchall(query, tuple(params))]

    async def create(self, intent: Intent) -> Created:
        async with self._db.connection() as conn, conn.transaction():
            row = await (await conn.execute(self._q["create"], as_row(intent))).fetchone()
            if row is not None:
                return Created(from_row(row), True)
            # ON CONFLICT waited for the first insert to commit, so this statement sees it.
            existing = await (
                await conn.execute(self._q["by_key"], (intent.agent, intent.idempotency_key))
            ).fetchone()
        assert existing is not None
        return recorded(from_row(existing), intent)

    async def get(self, intent_id: str) -> Intent | None:
        return next(iter(await self._rows(self._q["get"], (intent_id,))), None)

    async def by_key(self, agent: str, idempotency_key: str) -> Intent | None:
        return next(iter(await self._rows(self._q["by_key"], (agent, idempotency_key))), None)

    async def list(
        self, run_id: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> builtins.list[Intent]:
        text, params = list_query(run_id, states, limit)
        return await self._rows(self._shared.bind(text), params)

    async def claim_next(self, executor: str, now: float) -> Intent | None:
        rows = await self._rows(self._q["claim_next"], (claimant(executor), now, now))
        return rows[0] if rows else None

    async def _move(self, intent_id: str, action: str, executor: str | None = None, **fields: Any) -> Intent:
        async with self._db.connection() as conn, conn.transaction():
            current = await self._locked(conn, intent_id)
            new = moved(current, intent_id, action, executor, **fields)
            assert current is not None
            row = await (await conn.execute(self._q["move"], move_params(current, new))).fetchone()
        if row is None:
            raise lost_race(intent_id, action)
        return from_row(row)

    async def _locked(self, conn: PgConn, intent_id: str) -> Intent | None:
        row = await (await conn.execute(self._q["get_locked"], (intent_id,))).fetchone()
        return None if row is None else from_row(row)

    async def commit(self, intent_id: str, executor: str, outcome: Any, now: float) -> Intent:
        return await self._move(intent_id, "commit", claimant(executor), outcome=outcome, updated_at=now)

    async def fail(self, intent_id: str, executor: str, error: str, now: float) -> Intent:
        return await self._move(intent_id, "fail", claimant(executor), error=error, updated_at=now)

    async def mark_unknown(self, executor: str, now: float) -> builtins.list[Intent]:
        return oldest_first(await self._rows(self._q["mark_unknown"], (now, claimant(executor))))

    async def check(
        self, intent_id: str, executor: str, revision: int, now: float, limit: int | None = None
    ) -> Intent:
        async with self._db.connection() as conn, conn.transaction():
            current = await self._locked(conn, intent_id)
            new = checked(current, intent_id, executor, revision, now)
            assert current is not None
            if new is None:
                return current
            if limit is not None and current.run_id is not None:
                # One checker per (run, tool) at a time, so two cannot both pass the count.
                key = f"haltwire.intent-limit:{self._shared.schema}:{current.run_id}:{current.tool}"
                await conn.execute(advisory_lock(key))
                counted = await conn.execute(
                    self._q["checked_in_run"], (current.run_id, current.tool, intent_id)
                )
                row = await counted.fetchone()
                refused = over_limit(current, limit, int(row[0]) if row else 0)
                if refused is not None:
                    raise refused
            moved_row = await (await conn.execute(self._q["move"], move_params(current, new))).fetchone()
        if moved_row is None:
            raise lost_race(intent_id, "check")
        return from_row(moved_row)

    async def cancel_claimed(self, intent_id: str, executor: str, stop_id: str, now: float) -> Intent:
        return await self._move(intent_id, "cancel", claimant(executor), stop_id=stop_id, updated_at=now)

    async def cancel_for_stop(self, scope: Scope, stop_id: str, now: float) -> builtins.list[Intent]:
        # One statement: atomic. A row an executor is claiming or checking meanwhile is
        # re-read after its lock is released: claimed and unchecked, it is cancelled; checked,
        # it is left to settle (the check's row lock orders the two).
        text, params = cancel_query(scope, stop_id, now)
        return oldest_first(await self._rows(self._shared.bind(text), params))

    async def approve(self, intent_id: str, by: str, now: float) -> Intent:
        return await self._move(intent_id, "approve", decided_by=decider(by), updated_at=now)

    async def reject(self, intent_id: str, by: str, reason: str, now: float) -> Intent:
        return await self._move(
            intent_id, "reject", decided_by=decider(by, reason), decision_reason=reason, updated_at=now
        )

    async def aclose(self) -> None:
        await self._db.aclose()
