"""Intents: recorded requests to perform an irreversible action, committed later by the executor.

The gateway records an intent instead of calling an irreversible tool; the executor claims it,
checks the stop registry, performs the call with the intent's idempotency key and records the
outcome. The states, and who moves an intent between them::

    awaiting_approval --approve--> pending           (an operator)
    awaiting_approval --reject---> rejected          (an operator, with a reason)
    pending ----------claim------> claimed           (one executor, ``claim_next``)
    claimed ----------commit-----> committed         (the claiming executor)
    claimed ----------fail-------> failed            (the claiming executor)
    claimed ----------mark_unknown-> unknown         (the claiming executor, restarted after a crash)
    unknown ----------commit / fail                  (the same executor, after re-issuing the call
                                                      with the same idempotency key)
    pending, awaiting_approval,
    claimed, unknown never checked --cancel_for_stop--> cancelled   (a stop matching the intent)
    claimed, unknown --check------> (same state)     (the claiming executor's final registry
                                                      check, recording the registry revision)
    claimed, unknown --cancel-----> cancelled        (the claiming executor, when that check
                                                      finds a stop; never after a passed check)

The executor checks the registry itself immediately before performing the call (``check``).
``checked_revision`` is the registry revision that check saw: a stop with a higher revision
came after the decision to perform the call; an intent with no ``checked_revision`` never
reached the upstream, so a stop cancels it even when an executor holds it (its check then
finds it cancelled). One that passed its check is left to settle as committed or failed.

Terminal states: committed, failed,
cancelled, rejected. Every transition is conditional on the current state inside one write
transaction; a refused one raises ``IntentStateError``.

The idempotency key is unique per agent: the same key with the same tool and canonical
arguments returns the intent recorded first; with another tool or other arguments it raises
``IdempotencyConflict``. Nothing here deletes intents, so keys are kept for as long as the
table is (at least the 24 hours the idempotency rules promise).

The table lives in the registry's database (the same SQLite file, the same PostgreSQL
schema). The DDL and the queries are written once here, with ``?`` placeholders and
``{intents}`` for the table name; each backend binds them its own way. Failures raise
``RegistryUnavailable``, like the other stores'.
"""

from __future__ import annotations

import builtins
import json
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, Protocol, get_args

from haltwire.scope import GLOBAL, Scope
from haltwire.store.registry import RegistryUnavailable

IntentState = Literal[
    "awaiting_approval", "pending", "claimed", "unknown", "committed", "failed", "cancelled", "rejected"
]
STATES: Final[tuple[str, ...]] = get_args(IntentState)
TERMINAL: Final = frozenset({"committed", "failed", "cancelled", "rejected"})
#: What a stop cancels: intents no executor has claimed yet, and claimed ones never checked
#: (``checked_revision`` null: their call was not made).
CANCELLABLE: Final = ("pending", "awaiting_approval")
UNCHECKED: Final = ("claimed", "unknown")

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


class UnknownIntent(LookupError):
    """No intent has this id."""


class IntentStateError(Exception):
    """A transition the intent's current state (or its claimant) does not allow."""


class LimitReached(Exception):
    """The run already has ``limit`` checked intents for this tool (a per-run intent limit)."""

    def __init__(self, run_id: str, tool: str, limit: int) -> None:
        super().__init__(
            f"run {run_id} already has {limit} checked intent(s) for {tool}; the limit is {limit}"
        )
        self.run_id, self.tool, self.limit = run_id, tool, limit


class IdempotencyConflict(Exception):
    """An idempotency key reused with another tool or other arguments: terminal for the caller."""


@dataclass(frozen=True, slots=True)
class Intent:
    intent_id: str
    run_id: str | None
    agent: str
    tenant: str
    version: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    state: IntentState
    created_at: float
    updated_at: float
    needs_approval: bool = False
    claimed_by: str | None = None
    claimed_at: float | None = None
    outcome: Any = None
    error: str | None = None
    stop_id: str | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    checked_revision: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def scopes(self) -> frozenset[Scope]:
        """The scopes a stop must name to cancel this intent (its run only when known)."""
        scopes = {
            GLOBAL,
            Scope("agent", self.agent),
            Scope("tenant", self.tenant),
            Scope("version", f"{self.agent}@{self.version}"),
            Scope("tool", self.tool),
        }
        if self.run_id is not None:
            scopes.add(Scope("run", self.run_id))
        return frozenset(scopes)


class Created(NamedTuple):
    """What ``create`` answers: the intent, and False when the key had recorded it before."""

    intent: Intent
    created: bool


class IntentStore(Protocol):
    async def create(self, intent: Intent) -> Created:
        """Record a new intent (``pending``, or ``awaiting_approval`` when it needs approval).

        The key is unique per agent: a repeat with the same tool and canonical arguments
        answers the first intent with ``created=False``; otherwise ``IdempotencyConflict``.
        """
        ...

    async def get(self, intent_id: str) -> Intent | None: ...

    async def by_key(self, agent: str, idempotency_key: str) -> Intent | None: ...

    async def list(
        self, run_id: str | None = None, states: Collection[str] | None = None, limit: int = 100
    ) -> builtins.list[Intent]:
        """Intents, oldest first, of one run and/or in some states (``None``: any)."""
        ...

    async def claim_next(self, executor: str, now: float) -> Intent | None:
        """Claim the oldest pending intent for ``executor``; no two executors claim one intent."""
        ...

    async def commit(self, intent_id: str, executor: str, outcome: Any, now: float) -> Intent:
        """``claimed`` or ``unknown`` -> ``committed``, by the claiming executor only."""
        ...

    async def fail(self, intent_id: str, executor: str, error: str, now: float) -> Intent:
        """``claimed`` or ``unknown`` -> ``failed``, by the claiming executor only."""
        ...

    async def mark_unknown(self, executor: str, now: float) -> builtins.list[Intent]:
        """Every intent ``executor`` had claimed -> ``unknown`` (it restarted after a crash)."""
        ...

    async def check(
        self, intent_id: str, executor: str, revision: int, now: float, limit: int | None = None
    ) -> Intent:
        """Record the claiming executor's final registry check at ``revision`` (once: a second
        check answers the first). With ``limit``, ``LimitReached`` instead when the intent's run
        already has that many checked intents for its tool (counted in the same transaction)."""
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


# -- shared by the backends -------------------------------------------------------------------

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

#: ``{lock}`` is ``FOR UPDATE`` (PostgreSQL) or empty (SQLite, where the write transaction is
#: already exclusive); ``{skip}`` is ``FOR UPDATE SKIP LOCKED`` or empty.
QUERIES: Final = {
    # A repeated key inserts nothing and returns no row: then the first intent is read.
    "create": f"INSERT INTO {{intents}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
    f"ON CONFLICT (agent, idempotency_key) DO NOTHING RETURNING {_COLS}",
    "get": f"SELECT {_COLS} FROM {{intents}} WHERE intent_id = ?",
    "get_locked": f"SELECT {_COLS} FROM {{intents}} WHERE intent_id = ? {{lock}}",
    "by_key": f"SELECT {_COLS} FROM {{intents}} WHERE agent = ? AND idempotency_key = ?",
    "move": "UPDATE {intents} SET state = ?, updated_at = ?, claimed_by = ?, claimed_at = ?, "
    "outcome = ?, error = ?, stop_id = ?, decided_by = ?, decision_reason = ?, checked_revision = ? "
    f"WHERE intent_id = ? AND state = ? RETURNING {_COLS}",
    "claim_next": "UPDATE {intents} SET state = 'claimed', claimed_by = ?, claimed_at = ?, updated_at = ? "
    "WHERE state = 'pending' AND intent_id = (SELECT intent_id FROM {intents} WHERE state = 'pending' "
    f"{_OLDEST} LIMIT 1 {{skip}}) RETURNING {_COLS}",
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

#: action -> (the states it may start from, the state it leads to; None: the same state)
TRANSITIONS: Final[dict[str, tuple[tuple[str, ...], IntentState | None]]] = {
    "approve": (("awaiting_approval",), "pending"),
    "reject": (("awaiting_approval",), "rejected"),
    "commit": (("claimed", "unknown"), "committed"),
    "fail": (("claimed", "unknown"), "failed"),
    "check": (("claimed", "unknown"), None),
    "cancel": (("claimed", "unknown"), "cancelled"),
}
#: Actions only the executor that claimed the intent may take.
BY_CLAIMANT: Final = frozenset({"commit", "fail", "check", "cancel"})


def new_intent_id() -> str:
    return "int_" + secrets.token_hex(8)


def canonical(value: Any) -> str:
    """The stored text of a JSON value; equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def new_intent(
    *,
    agent: str,
    tenant: str,
    version: str,
    tool: str,
    arguments: dict[str, Any],
    idempotency_key: str,
    now: float,
    run_id: str | None,
    needs_approval: bool,
) -> Intent:
    """A new intent, checked; ``ValueError`` for what cannot be stored."""
    if not isinstance(arguments, dict):
        raise ValueError("an intent's arguments are a JSON object")
    for name, value in (("agent", agent), ("tool", tool), ("idempotency_key", idempotency_key)):
        if not value:
            raise ValueError(f"an intent needs a non-empty {name}")
    canonical(arguments)  # raises ValueError for NaN / infinity, TypeError for non-JSON values
    return Intent(
        intent_id=new_intent_id(),
        run_id=run_id,
        agent=agent,
        tenant=tenant,
        version=version,
        tool=tool,
        arguments=arguments,
        idempotency_key=idempotency_key,
        state="awaiting_approval" if needs_approval else "pending",
        created_at=now,
        updated_at=now,
        needs_approval=needs_approval,
    )


def as_row(i: Intent) -> tuple[object, ...]:
    return (
        i.intent_id,
        i.run_id,
        i.agent,
        i.tenant,
        i.version,
        i.tool,
        canonical(i.arguments),
        i.idempotency_key,
        i.state,
        i.created_at,
        i.updated_at,
        i.needs_approval,
        i.claimed_by,
        i.claimed_at,
        None if i.outcome is None else canonical(i.outcome),
        i.error,
        i.stop_id,
        i.decided_by,
        i.decision_reason,
        i.checked_revision,
    )


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


def recorded(existing: Intent, new: Intent) -> Created:
    """The first intent for a repeated key, if the repeat asks for the same call."""
    if existing.tool != new.tool or canonical(existing.arguments) != canonical(new.arguments):
        raise IdempotencyConflict(
            f"the idempotency key {new.idempotency_key!r} of agent {new.agent!r} was used for "
            f"intent {existing.intent_id} with another tool or other arguments; a key names one call"
        )
    return Created(existing, False)


def moved(
    current: Intent | None, intent_id: str, action: str, executor: str | None = None, **fields: Any
) -> Intent:
    """``current`` after ``action``, or ``UnknownIntent`` / ``IntentStateError`` if refused."""
    if current is None:
        raise UnknownIntent(intent_id)
    sources, target = TRANSITIONS[action]
    if current.state not in sources:
        leads_to = f" -> {target}" if target else ""
        raise IntentStateError(
            f"intent {intent_id} is {current.state}: cannot {action} it ({' or '.join(sources)}{leads_to} only)"
        )
    if action in BY_CLAIMANT and current.claimed_by != executor:
        raise IntentStateError(
            f"intent {intent_id} is {current.state} by executor {current.claimed_by!r}: "
            f"executor {executor!r} cannot {action} it"
        )
    if action == "cancel" and current.checked_revision is not None:
        raise IntentStateError(
            f"intent {intent_id} passed its final check at revision {current.checked_revision}: "
            "its call may have been made, so it settles as committed or failed, never cancelled"
        )
    values = {name: getattr(current, name) for name in COLUMNS}
    return Intent(**{**values, **fields, "state": target or current.state})


def checked(
    current: Intent | None, intent_id: str, executor: str, revision: int, now: float
) -> Intent | None:
    """``current`` after its final check at ``revision``; None when it was checked before (a
    repeated check answers the first one, so a restarted executor can ask again)."""
    new = moved(current, intent_id, "check", claimant(executor), checked_revision=revision, updated_at=now)
    assert current is not None
    return None if current.checked_revision is not None else new


def over_limit(intent: Intent, limit: int | None, count: int) -> LimitReached | None:
    """The refusal of a per-run intent limit, when ``count`` checked intents already reach it."""
    if limit is None or intent.run_id is None or count < limit:
        return None
    return LimitReached(intent.run_id, intent.tool, limit)


def move_params(old: Intent, new: Intent) -> tuple[object, ...]:
    """The parameters of ``QUERIES["move"]``: ``new``'s mutable fields, conditional on ``old``'s state."""
    return (
        new.state,
        new.updated_at,
        new.claimed_by,
        new.claimed_at,
        None if new.outcome is None else canonical(new.outcome),
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


def oldest_first(intents: list[Intent]) -> list[Intent]:
    return sorted(intents, key=lambda i: (i.created_at, i.intent_id))


def decider(by: str, reason: str | None = None) -> str:
    """Who approved or rejected; a rejection also needs its reason."""
    if not by:
        raise ValueError("an approval or rejection names who decided")
    if reason is not None and not reason.strip():
        raise ValueError("a rejection needs a reason")
    return by


def claimant(executor: str) -> str:
    if not executor:
        raise ValueError("an executor needs a non-empty id")
    return executor


__all__ = [
    "CANCELLABLE",
    "STATES",
    "TERMINAL",
    "Created",
    "IdempotencyConflict",
    "Intent",
    "IntentState",
    "IntentStateError",
    "IntentStore",
    "LimitReached",
    "RegistryUnavailable",
    "UnknownIntent",
    "new_intent_id",
]
