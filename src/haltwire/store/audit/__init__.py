"""The audit log: who did what to which stop, append-only and hash-chained.

Each record carries ``prev_hash`` (the previous record's ``hash``; 64 zeros for seq 1) and its
own ``hash``: the SHA-256 hex of the canonical JSON of every other field. So each record
commits to the one before it, and ``verify`` finds a changed, removed or reordered record.
The DDL, the queries (``?`` placeholders, ``{audit}`` for the table) and the row helpers are
written once here; ``tables.SqlAuditLog`` is the log over either SQL backend. Store failures
raise the registry's ``RegistryUnavailable``: callers fail closed the same way.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, cast

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import row_of

Outcome = Literal["ok", "refused"]

#: ``prev_hash`` of the first record.
GENESIS = "0" * 64

#: The columns of one audit row, in this order, in every backend (``detail`` is JSON text).
COLUMNS = (
    "seq",
    "at",
    "actor",
    "role",
    "action",
    "target",
    "outcome",
    "reason",
    "detail",
    "prev_hash",
    "hash",
)

Row = Sequence[Any]
#: An append's fields, validated: actor, role, action, target, outcome, reason, detail.
Fields = tuple[str, str, str, str, Outcome, str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class AuditRecord:
    seq: int
    at: float
    actor: str
    role: str
    action: str
    target: str
    outcome: Outcome
    reason: str
    detail: dict[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    problem: str | None = None


class AuditLog(ABC):
    """The log. ``append`` validates a request once, for every backend, before the store is
    touched; a backend writes the record (``_append``) and reads them (``records``)."""

    async def append(
        self,
        actor: str,
        role: str,
        action: str,
        target: str,
        outcome: Outcome,
        reason: str,
        detail: Mapping[str, Any],
        *,
        now: float,
    ) -> AuditRecord:
        """Append one record with the next seq, chained to the latest record."""
        outcome = checked_append(actor, action, outcome, detail, now)
        return await self._append((actor, role, action, target, outcome, reason, detail), now)

    @abstractmethod
    async def _append(self, fields: Fields, now: float) -> AuditRecord:
        """Write ``new_record`` after the latest record, in one transaction."""

    @abstractmethod
    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        """Records with a seq strictly greater than ``since_seq``, ascending."""

    @abstractmethod
    async def aclose(self) -> None: ...


# -- hashing and verification ------------------------------------------------------------------


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, no NaN/Infinity: the same text for the same content."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def hash_of(record: AuditRecord) -> str:
    """What ``record.hash`` should be: SHA-256 of the canonical JSON of every other field."""
    body = {field: getattr(record, field) for field in COLUMNS if field != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def _recomputed(record: AuditRecord) -> str | None:
    try:
        return hash_of(record)
    except (TypeError, ValueError):  # e.g. a time changed to NaN: not a valid record at all
        return None


def verify(records: Iterable[AuditRecord]) -> VerifyResult:
    """Check a whole log from seq 1, in the given order; stops at the first bad record.

    ``first_bad_seq`` is the seq of the changed or misplaced record, or for a removed record
    the seq that is missing. ``checked`` counts the records that passed.
    """
    expected_seq, prev = 1, GENESIS
    checked = 0
    for record in records:
        if record.seq != expected_seq:
            if record.seq > expected_seq:
                missing = str(expected_seq)
                if record.seq > expected_seq + 1:
                    missing += f"..{record.seq - 1}"
                problem = f"seq gap: expected {expected_seq}, found {record.seq} (record {missing} removed)"
                return VerifyResult(False, checked, expected_seq, problem)
            problem = (
                f"seq not increasing: expected {expected_seq}, found {record.seq} (reordered or duplicated)"
            )
            return VerifyResult(False, checked, record.seq, problem)
        if _recomputed(record) != record.hash:
            return VerifyResult(False, checked, record.seq, "hash mismatch: the record's fields were changed")
        if record.prev_hash != prev:
            before = "the genesis hash" if expected_seq == 1 else f"the hash of seq {expected_seq - 1}"
            problem = (
                f"prev_hash mismatch: does not equal {before} (a record before it was changed or removed)"
            )
            return VerifyResult(False, checked, record.seq, problem)
        expected_seq, prev = expected_seq + 1, record.hash
        checked += 1
    return VerifyResult(True, checked)


# -- shared by the backends --------------------------------------------------------------------

_COLS = ", ".join(COLUMNS)

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {audit} (
    seq       {integer_key},
    at        DOUBLE PRECISION NOT NULL,
    actor     TEXT NOT NULL,
    role      TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    outcome   TEXT NOT NULL CHECK (outcome IN ('ok', 'refused')),
    reason    TEXT NOT NULL,
    detail    TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS audit_by_target ON {audit} (target, seq)",
)

QUERIES: Final = {
    "insert": f"INSERT INTO {{audit}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)})",
    "last": "SELECT seq, hash FROM {audit} ORDER BY seq DESC LIMIT 1",
}


def records_query(since_seq: int, target: str | None, limit: int | None) -> tuple[str, list[object]]:
    """The ``records`` query text (``{audit}`` unbound) and its parameters."""
    text, params = f"SELECT {_COLS} FROM {{audit}} WHERE seq > ?", list[object]([since_seq])
    if target is not None:
        text += " AND target = ?"
        params.append(target)
    text += " ORDER BY seq"
    if limit is not None:
        text += " LIMIT ?"
        params.append(max(0, limit))
    return text, params


def new_record(last: Row | None, fields: Fields, now: float) -> AuditRecord:
    """The record after ``last`` (a ``(seq, hash)`` row, or None for an empty log)."""
    actor, role, action, target, outcome, reason, detail = fields
    seq, prev_hash = (1, GENESIS) if last is None else (int(last[0]) + 1, str(last[1]))
    # The detail as it will read back from the store, so the hash is over the stored content.
    stored_detail: dict[str, Any] = json.loads(canonical_json(dict(detail)))
    record = AuditRecord(seq, now, actor, role, action, target, outcome, reason, stored_detail, prev_hash, "")
    return replace(record, hash=hash_of(record))


def checked_append(actor: str, action: str, outcome: str, detail: Mapping[str, Any], now: float) -> Outcome:
    """Validate an append request before touching the store; answers the outcome typed."""
    if not actor.strip():
        raise ValueError("an audit record needs an actor")
    if not action.strip():
        raise ValueError("an audit record needs an action")
    if outcome not in ("ok", "refused"):
        raise ValueError(f"outcome must be 'ok' or 'refused', not {outcome!r}")
    if now != now or now in (float("inf"), float("-inf")):
        raise ValueError("now must be a finite time")
    canonical_json(dict(detail))  # raises TypeError / ValueError when not JSON
    return cast(Outcome, outcome)


def as_row(record: AuditRecord) -> tuple[object, ...]:
    """The record's column values in ``COLUMNS`` order."""
    return row_of(record, COLUMNS, detail=canonical_json)


def from_row(row: Row) -> AuditRecord:
    """A record as stored. A detail that is not a JSON object is kept (wrapped) so ``verify``
    reports the record as changed instead of the read failing."""
    seq, at, actor, role, action, target, outcome, reason, detail, prev_hash, digest = row
    try:
        parsed = json.loads(detail)
    except (TypeError, ValueError):
        parsed = None
    parsed_detail: dict[str, Any] = (
        parsed if isinstance(parsed, dict) else {"<unreadable detail>": str(detail)}
    )
    return AuditRecord(
        seq=int(seq),
        at=float(at),
        actor=str(actor),
        role=str(role),
        action=str(action),
        target=str(target),
        outcome=cast(Outcome, str(outcome)),  # as stored: a changed value fails ``verify``
        reason=str(reason),
        detail=parsed_detail,
        prev_hash=str(prev_hash),
        hash=str(digest),
    )


__all__ = [
    "COLUMNS",
    "GENESIS",
    "AuditLog",
    "AuditRecord",
    "Outcome",
    "RegistryUnavailable",
    "VerifyResult",
    "canonical_json",
    "hash_of",
    "verify",
]
