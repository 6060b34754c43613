"""Where intents live: one table beside the registry (the same SQLite file, the same PostgreSQL schema).

The intent itself, its states and its rules are ``haltwire.intents``; this module persists and
queries. The DDL and the queries are written once here, with ``?`` placeholders and
``{intents}`` for the table name; ``tables.SqlIntentStore`` runs them on either backend,
applying ``haltwire.intents.moved`` to the row it read under its write lock. Nothing here deletes
intents, so keys are kept for as long as the table is (at least the 24 hours the idempotency
rules promise). Failures raise ``RegistryUnavailable``, like the other stores'.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Collection, Sequence
from typing import Any, Final, Protocol

from haltwire.intents import CANCELLABLE, STATES, UNCHECKED, Created, Intent, IntentStateError, canonical
from haltwire.scope import Scope
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import row_of

#: The columns of one intent row, in this order, in every backend.
COLUMNS: Final = (
    "intent_id",
    "run_id",
    "agent",
    "tenant",
    "version",
    "tool",
    "arguments",
    "idempotency_key",
    "state",
    "created_at",
    "updated_at",
    "needs_approval",
    "claimed_by",
    "claimed_at",
    "outcome",
    "error",
    "stop_id",
    "decided_by",
    "decision_reason",
    "checked_revision",
)


Row = Sequence[Any]


class IntentStore(Protocol):
    async def create(self, intent: Intent) -> Created:
        """Record a new intent (``pending``, or ``awaiting_approval`` when it needs approval).

        The key is unique per agent: a repeat with the same tool and canonical arguments
        answers the first intent with ``created=False``; otherwise ``IdempotencyConflict``.
        """
        ...

    async def get(self, intent_id: str) -> Intent | None: ...

    async def get_locked(self, intent_id: str) -> Intent | None:
        """The intent read in a write transaction (the caller's, joined), its row locked until
        that transaction ends (PostgreSQL; in SQLite the transaction excludes every writer)."""
        ...

    async def get_locked_many(self, intent_ids: Sequence[str]) -> dict[str, Intent]:
        """``get_locked`` for several intents in one statement: those that exist, by id."""
        ...

    async def by_key(self, agent: str, idempotency_key: str) -> Intent | None: ...

    async def list(
        self, run_id: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> builtins.list[Intent]:
        """Intents, oldest first, of one run and/or in some states (``None``: any)."""
        ...

    async def count_by_state(self) -> dict[str, int]:
        """How many intents are in each state."""
        ...

    async def claim_next(self, executor: str, now: float) -> Intent | None:
        """Claim the oldest pending intent for ``executor``; no two executors claim one intent."""
        ...

    async def claim_many(self, executor: str, now: float, limit: int) -> builtins.list[Intent]:
        """Claim up to ``limit`` of the oldest pending intents for ``executor``, oldest first, in
        one statement; no two executors claim one intent."""
        ...

    async def commit(
        self, intent_id: str, executor: str, outcome: Any, now: float, current: Intent | None = None
    ) -> Intent:
        """``claimed`` or ``unknown`` -> ``committed``, by the claiming executor only.
        ``current``: the intent as the caller's transaction read it locked (not read again)."""
        ...

    async def fail(
        self, intent_id: str, executor: str, error: str, now: float, current: Intent | None = None
    ) -> Intent:
        """``claimed`` or ``unknown`` -> ``failed``, by the claiming executor only (``current``:
        as for ``commit``)."""
        ...

    async def mark_unknown(self, executor: str, now: float) -> builtins.list[Intent]:
        """Every intent ``executor`` had claimed -> ``unknown`` (it restarted after a crash)."""
        ...

    async def check(
        self,
        intent_id: str,
        executor: str,
        revision: int,
        now: float,
        limit: int | None = None,
        current: Intent | None = None,
    ) -> Intent:
        """Record the claiming executor's final registry check at ``revision`` (once: a second
        check answers the first). With ``limit``, ``LimitReached`` instead when the intent's run
        already has that many checked intents for its tool (counted in the same transaction).
        ``current``: the intent as ``get_locked`` read it in the caller's transaction (not
        read again)."""
        ...

    async def cancel_claimed(self, intent_id: str, executor: str, stop_id: str, now: float) -> Intent:
        """``claimed`` or ``unknown``, never checked -> ``cancelled``: the final check found a stop."""
        ...

    async def cancel_for_stop(self, scope: Scope, stop_id: str, now: float) -> builtins.list[Intent]:
        """Every intent matching ``scope`` whose call was not made -> ``cancelled``, in one
        transaction: pending, awaiting approval, and claimed or unknown but never checked."""
        ...

    async def approve(self, intent_id: str, by: str, now: float) -> Intent:
        """``awaiting_approval`` -> ``pending``."""
        ...

    async def reject(self, intent_id: str, by: str, reason: str, now: float) -> Intent:
        """``awaiting_approval`` -> ``rejected``."""
        ...

    async def aclose(self) -> None: ...


_COLS = ", ".join(COLUMNS)


DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {intents} (
    intent_id       TEXT PRIMARY KEY,
    run_id          TEXT,
    agent           TEXT NOT NULL,
    tenant          TEXT NOT NULL,
    version         TEXT NOT NULL,
    tool            TEXT NOT NULL,
    arguments       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    state           TEXT NOT NULL,
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL,
    needs_approval  BOOLEAN NOT NULL,
    claimed_by      TEXT,
    claimed_at      DOUBLE PRECISION,
    outcome         TEXT,
    error           TEXT,
    stop_id         TEXT,
    decided_by      TEXT,
    decision_reason TEXT,
    checked_revision BIGINT,
    UNIQUE (agent, idempotency_key)
)""",
    "CREATE INDEX IF NOT EXISTS intents_by_state ON {intents} (state, created_at)",
    "CREATE INDEX IF NOT EXISTS intents_by_run ON {intents} (run_id, created_at)",
)


_OLDEST = "ORDER BY created_at, intent_id"


#: ``{for_update}`` and ``{skip_locked}``: row locks in PostgreSQL, none in SQLite (``sql.CLAUSES``).
QUERIES: Final = {
    # A repeated key inserts nothing and returns no row: then the first intent is read.
    "create": f"INSERT INTO {{intents}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    f"ON CONFLICT (agent, idempotency_key) DO NOTHING RETURNING {_COLS}",
    "get": f"SELECT {_COLS} FROM {{intents}} WHERE intent_id = ?",
    "get_locked": f"SELECT {_COLS} FROM {{intents}} WHERE intent_id = ? {{for_update}}",
    "by_key": f"SELECT {_COLS} FROM {{intents}} WHERE agent = ? AND idempotency_key = ?",
    "move": "UPDATE {intents} SET state = ?, updated_at = ?, claimed_by = ?, claimed_at = ?, "
    "outcome = ?, error = ?, stop_id = ?, decided_by = ?, decision_reason = ?, checked_revision = ? "
    f"WHERE intent_id = ? AND state = ? RETURNING {_COLS}",
    "claim_next": "UPDATE {intents} SET state = 'claimed', claimed_by = ?, claimed_at = ?, updated_at = ? "
    "WHERE state = 'pending' AND intent_id = (SELECT intent_id FROM {intents} WHERE state = 'pending' "
    f"{_OLDEST} LIMIT 1 {{skip_locked}}) RETURNING {_COLS}",
    # Two statements in one transaction: in PostgreSQL a LIMIT subquery inside IN (...) may be
    # run again per row, each run skipping other locked rows, and claim more than asked.
    "pending": f"SELECT intent_id FROM {{intents}} WHERE state = 'pending' {_OLDEST} LIMIT ? {{skip_locked}}",
    "mark_unknown": "UPDATE {intents} SET state = 'unknown', updated_at = ? "
    f"WHERE state = 'claimed' AND claimed_by = ? RETURNING {_COLS}",
    # What a per-run intent limit counts: the run's intents for a tool that passed their check.
    "checked_in_run": "SELECT COUNT(*) FROM {intents} WHERE run_id = ? AND tool = ? "
    "AND checked_revision IS NOT NULL AND intent_id <> ?",
}


#: The column expression a scope of each kind is compared with (``global`` matches every row).
_SCOPE_COLUMN: Final = {
    "run": "run_id",
    "tenant": "tenant",
    "tool": "tool",
    "agent": "agent",
    "version": "agent || '@' || version",
}


def as_row(i: Intent) -> tuple[object, ...]:
    return row_of(i, COLUMNS, arguments=canonical, outcome=_canonical_or_none)


def _canonical_or_none(value: Any) -> str | None:
    return None if value is None else canonical(value)


def from_row(row: Row) -> Intent:
    (intent_id, run_id, agent, tenant, version, tool, arguments, key, state, created_at, updated_at,
     needs_approval, claimed_by, claimed_at, outcome, error, stop_id, decided_by, reason, checked) = row  # fmt: skip
    return Intent(
        intent_id=str(intent_id),
        run_id=None if run_id is None else str(run_id),
        agent=str(agent),
        tenant=str(tenant),
        version=str(version),
        tool=str(tool),
        arguments=json.loads(arguments),
        idempotency_key=str(key),
        state=state,
        created_at=float(created_at),
        updated_at=float(updated_at),
        needs_approval=bool(needs_approval),
        claimed_by=None if claimed_by is None else str(claimed_by),
        claimed_at=None if claimed_at is None else float(claimed_at),
        outcome=None if outcome is None else json.loads(outcome),
        error=None if error is None else str(error),
        stop_id=None if stop_id is None else str(stop_id),
        decided_by=None if decided_by is None else str(decided_by),
        decision_reason=None if reason is None else str(reason),
        checked_revision=None if checked is None else int(checked),
    )


def move_params(old: Intent, new: Intent) -> tuple[object, ...]:
    """The parameters of ``QUERIES["move"]``: ``new``'s mutable fields, conditional on ``old``'s state."""
    return (
        new.state,
        new.updated_at,
        new.claimed_by,
        new.claimed_at,
        _canonical_or_none(new.outcome),
        new.error,
        new.stop_id,
        new.decided_by,
        new.decision_reason,
        new.checked_revision,
        old.intent_id,
        old.state,
    )


def lost_race(intent_id: str, action: str) -> IntentStateError:
    """The conditional update matched nothing: the state changed under the row lock."""
    return IntentStateError(f"intent {intent_id} changed state concurrently: cannot {action} it")


def locked_many_query(ids: Sequence[str]) -> str:
    """The read of the intents ``ids``, their rows locked (``{intents}`` and ``{for_update}`` unbound)."""
    return f"SELECT {_COLS} FROM {{intents}} WHERE intent_id IN ({', '.join('?' for _ in ids)}) {{for_update}}"


def claim_query(ids: Sequence[str]) -> str:
    """The update that claims the pending intents ``ids`` (``{intents}`` unbound); its parameters
    are the executor, the time twice, then ``ids``."""
    marks = ", ".join("?" for _ in ids)
    return (
        "UPDATE {intents} SET state = 'claimed', claimed_by = ?, claimed_at = ?, updated_at = ? "
        f"WHERE state = 'pending' AND intent_id IN ({marks}) RETURNING {_COLS}"
    )


def list_query(run_id: str | None, states: Collection[str] | None, limit: int) -> tuple[str, list[object]]:
    """The ``list`` query text (``{intents}`` unbound) and its parameters."""
    where: list[str] = []
    params: list[object] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if states is not None:
        unknown = set(states) - set(STATES)
        if unknown:
            raise ValueError(f"not intent states: {', '.join(sorted(unknown))}")
        if not states:
            where.append("1 = 0")
        else:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            params.extend(states)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    params.append(max(0, limit))
    return f"SELECT {_COLS} FROM {{intents}} {clause}{_OLDEST} LIMIT ?", params


def cancel_query(scope: Scope, stop_id: str, now: float) -> tuple[str, list[object]]:
    """The ``cancel_for_stop`` update text (``{intents}`` unbound) and its parameters."""
    if not stop_id:
        raise ValueError("a cancellation needs the stop's id")
    states = ", ".join(f"'{s}'" for s in CANCELLABLE)
    unchecked = ", ".join(f"'{s}'" for s in UNCHECKED)
    text = (
        "UPDATE {intents} SET state = 'cancelled', stop_id = ?, updated_at = ? "
        f"WHERE (state IN ({states}) OR (state IN ({unchecked}) AND checked_revision IS NULL))"
    )
    if scope.kind == "global":
        return f"{text} RETURNING {_COLS}", [stop_id, now]
    return f"{text} AND {_SCOPE_COLUMN[scope.kind]} = ? RETURNING {_COLS}", [stop_id, now, scope.value]


__all__ = ["COLUMNS", "IntentStore", "RegistryUnavailable"]
