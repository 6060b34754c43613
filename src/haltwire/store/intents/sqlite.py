"""Intents in the registry's SQLite file (table ``intents``).

Its own connection to the file (WAL, ``synchronous=FULL``, one lock), like the run store's.
Every write runs in ``BEGIN IMMEDIATE``, which excludes every other writer on the file, so
two executors (two connections, two processes) never claim one intent.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection
from pathlib import Path
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
    from_row,
    list_query,
    lost_race,
    move_params,
)
from haltwire.store.sql import SqliteConnection, immediate

_TABLES = {"intents": "intents", "lock": "", "skip": ""}
_SCHEMA = ";\n".join(statement.format(**_TABLES) for statement in DDL) + ";"
_Q = {name: text.format(**_TABLES) for name, text in QUERIES.items()}


def _get(conn: sqlite3.Connection, intent_id: str) -> Intent | None:
    row = conn.execute(_Q["get"], (intent_id,)).fetchone()
    return None if row is None else from_row(row)


class SqliteIntentStore:
    def __init__(self, db: SqliteConnection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteIntentStore:
        return cls(await SqliteConnection.open(path, _SCHEMA, what="intent store", store="intents"))

    async def create(self, intent: Intent) -> Created:

        def write(conn: sqlite3.Connection) -> Created:
            with immediate(conn):
                rows = conn.execute(_Q["create"], as_row(intent)).fetchall()
                if rows:
                    return Created(from_row(rows[0]), True)
                row = conn.execute(_Q["by_key"], (intent.agent, intent.idempotency_key)).fetchone()
            return recorded(from_row(row), intent)

        return await self._db.run(write)

    async def get(self, intent_id: str) -> Intent | None:
        return await self._db.run(lambda conn: _get(conn, intent_id))

    async def by_key(self, agent: str, idempotency_key: str) -> Intent | None:
        row = await self._db.run(lambda conn: conn.execute(_Q["by_key"], (agent, idempotency_key)).fetchone())
        return None if row is None else from_row(row)

    async def list(
        self, run_id: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> builtins.list[Intent]:
        text, params = list_query(run_id, states, limit)
        query = text.format(**_TABLES)
        rows = await self._db.run(lambda conn: conn.execute(query, params).fetchall())
        return [from_row(row) for row in rows]

    async def claim_next(self, executor: str, now: float) -> Intent | None:
        params = (claimant(executor), now, now)

        def write(conn: sqlite3.Connection) -> Intent | None:
            with immediate(conn):
                rows = conn.execute(_Q["claim_next"], params).fetchall()
            return from_row(rows[0]) if rows else None

        return await self._db.run(write)

    async def _move(self, intent_id: str, action: str, executor: str | None = None, **fields: Any) -> Intent:
        def write(conn: sqlite3.Connection) -> Intent:
            with immediate(conn):  # read, check and write the state in one write transaction
                current = _get(conn, intent_id)
                new = moved(current, intent_id, action, executor, **fields)
                assert current is not None
                rows = conn.execute(_Q["move"], move_params(current, new)).fetchall()
            if not rows:
                raise lost_race(intent_id, action)
            return from_row(rows[0])

        return await self._db.run(write)

    async def commit(self, intent_id: str, executor: str, outcome: Any, now: float) -> Intent:
        return await self._move(intent_id, "commit", claimant(executor), outcome=outcome, updated_at=now)

    async def fail(self, intent_id: str, executor: str, error: str, now: float) -> Intent:
        return await self._move(intent_id, "fail", claimant(executor), error=error, updated_at=now)

    async def mark_unknown(self, executor: str, now: float) -> builtins.list[Intent]:
        params = (now, claimant(executor))

        def write(conn: sqlite3.Connection) -> builtins.list[Intent]:
            with immediate(conn):
                rows = conn.execute(_Q["mark_unknown"], params).fetchall()
            return oldest_first([from_row(row) for row in rows])

        return await self._db.run(write)

    async def check(
        self, intent_id: str, executor: str, revision: int, now: float, limit: int | None = None
    ) -> Intent:
        def write(conn: sqlite3.Connection) -> Intent:
            with immediate(conn):  # the count and the write in one exclusive transaction
                current = _get(conn, intent_id)
                new = checked(current, intent_id, executor, revision, now)
                assert current is not None
                if new is None:
                    return current
                if limit is not None:
                    (count,) = conn.execute(
                        _Q["checked_in_run"], (current.run_id, current.tool, intent_id)
                    ).fetchone()
                    refused = over_limit(current, limit, int(count))
                    if refused is not None:
                        raise refused
                rows = conn.execute(_Q["move"], move_params(current, new)).fetchall()
            if not rows:
                raise lost_race(intent_id, "check")
            return from_row(rows[0])

        return await self._db.run(write)

    async def cancel_claimed(self, intent_id: str, executor: str, stop_id: str, now: float) -> Intent:
        return await self._move(intent_id, "cancel", claimant(executor), stop_id=stop_id, updated_at=now)

    async def cancel_for_stop(self, scope: Scope, stop_id: str, now: float) -> builtins.list[Intent]:
        text, params = cancel_query(scope, stop_id, now)
        query = text.format(**_TABLES)

        def write(conn: sqlite3.Connection) -> builtins.list[Intent]:
            with immediate(conn):
                rows = conn.execute(query, params).fetchall()
            return oldest_first([from_row(row) for row in rows])

        return await self._db.run(write)

    async def approve(self, intent_id: str, by: str, now: float) -> Intent:
        return await self._move(intent_id, "approve", decided_by=decider(by), updated_at=now)

    async def reject(self, intent_id: str, by: str, reason: str, now: float) -> Intent:
        return await self._move(
            intent_id, "reject", decided_by=decider(by, reason), decision_reason=reason, updated_at=now
        )

    async def aclose(self) -> None:
        await self._db.aclose()
