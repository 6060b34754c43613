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

Terminal states: committed, failed, cancelled, rejected. ``moved`` is the state machine: every
store applies it to the row it read, conditional on the row's state inside one write
transaction, and a refused transition raises ``IntentStateError``.

The idempotency key is unique per agent: the same key with the same tool and canonical
arguments returns the intent recorded first; with another tool or other arguments it raises
``IdempotencyConflict`` (``recorded``). A per-run limit (``[[intent_limits]]``) counts the
run's checked intents for a tool (``over_limit``). Storage is ``haltwire.store.intents``.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, get_args

from haltwire.scope import GLOBAL, Scope

IntentState = Literal[
    "awaiting_approval", "pending", "claimed", "unknown", "committed", "failed", "cancelled", "rejected"
]


STATES: Final[tuple[str, ...]] = get_args(IntentState)


TERMINAL: Final = frozenset({"committed", "failed", "cancelled", "rejected"})


#: What a stop cancels: intents no executor has claimed yet, and claimed ones never checked
#: (``checked_revision`` null: their call was not made).
CANCELLABLE: Final = ("pending", "awaiting_approval")


UNCHECKED: Final = ("claimed", "unknown")


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


#: The fields of an intent, in order (its JSON keys).
FIELDS: Final = tuple(f.name for f in dataclasses.fields(Intent))


def intent_fields(intent: Intent) -> dict[str, Any]:
    """The intent as a dict of its fields, for JSON written at once: shallow (``asdict`` copies
    the arguments and outcome deeply, a tenth of a batch's time at the control plane)."""
    return {name: getattr(intent, name) for name in FIELDS}


class Created(NamedTuple):
    """What ``create`` answers: the intent, and False when the key had recorded it before."""

    intent: Intent
    created: bool


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


def recorded(existing: Intent, new: Intent) -> Created:
    """The first intent for a repeated key, if the repeat asks for the same call."""
    if existing.tenant != new.tenant:
        # Keys are unique per agent id in the store: nothing of another tenant's intent shows.
        raise IdempotencyConflict(
            f"the idempotency key {new.idempotency_key!r} of agent {new.agent!r} names another call; "
            "a key names one call: use another"
        )
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
    return dataclasses.replace(current, **fields, state=target or current.state)


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
