"""The audit log: who did what to which stop, append-only and hash-chained with a secret key.

Each record carries ``prev_hash`` (the previous record's ``hash``; 64 zeros for seq 1) and its
own ``hash``: the HMAC-SHA256 (with the log's key) of the canonical JSON of every other field.
So each record commits to the one before it, ``verify`` finds a changed, removed or reordered
record, and someone who can edit the database but does not hold the key cannot write a record
or recompute the chain after an edit. What the chain cannot show alone is its newest records
removed: a verifier holds the head (``head``: the last seq and hash) outside the database and
checks it later (``Chain.expect``).

A log without a key (``key=None``) hashes with plain SHA-256, as logs did before keys: a keyed
log accepts such records only as a prefix closed by an ``audit.seal`` record (written by the
control plane the first time it starts with a key), which names the prefix's last seq and hash.

The DDL, the queries (``?`` placeholders, ``{audit}`` for the table) and the row helpers are
written once here; ``tables.SqlAuditLog`` is the log over either SQL backend. Store failures
raise the registry's ``RegistryUnavailable``: callers fail closed the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
#: An append's fields, validated: actor, role, action, target, outcome, reason, and the detail
#: as it is stored (its canonical JSON, made once: an append is on every write's path).
Fields = tuple[str, str, str, str, Outcome, str, str]


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
    #: Why the stored row is not a record at all (a time that is not a time), or None. Such a
    #: record never verifies: ``verify`` reports it as tampered at its seq.
    malformed: str | None = None


@dataclass(frozen=True, slots=True)
class Head:
    """The newest record's seq and hash (seq 0 and ``GENESIS`` for an empty log): what a verifier
    holds outside the database, to tell later that nothing up to it was removed or rewritten."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """``SEQ:HASH`` as ``haltwire audit head`` prints it; ``ValueError`` otherwise."""
        seq, sep, digest = text.strip().partition(":")
        if (
            not sep
            or not seq.isdigit()
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise ValueError(f"a head is SEQ:HASH (64 lowercase hex digits), not {text[:100]!r}")
        if len(seq) > 19 or int(seq) >= 2**63:  # past any store's seq column (64-bit): a driver error
            raise ValueError("a head's SEQ is below 2**63")
        return cls(int(seq), digest)


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    problem: str | None = None
    #: The last record that verified (seq 0 and ``GENESIS`` when none did).
    head_seq: int = 0
    head_hash: str = GENESIS
    #: Records written before the log had a key, closed by an ``audit.seal`` record.
    sealed: int = 0


class AuditLog(ABC):
    """The log. ``append`` validates a request once, for every backend, before the store is
    touched; a backend writes the record (``_append``) and reads them (``records``).
    ``key``: the chain's secret (None: unkeyed SHA-256)."""

    key: bytes | None = None

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
        outcome, stored = checked_append(actor, action, outcome, detail, now)
        return await self._append((actor, role, action, target, outcome, reason, stored), now)

    @abstractmethod
    async def _append(self, fields: Fields, now: float) -> AuditRecord:
        """Write ``new_record`` after the latest record, in one transaction."""

    @abstractmethod
    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        """Records with a seq strictly greater than ``since_seq``, ascending."""

    @abstractmethod
    async def about(self, names: Iterable[str]) -> list[AuditRecord]:
        """The records whose target, or a run, intent or stop their detail names, is in ``names``
        (a superset of what is about them: callers filter), in seq order, read by an index."""

    @abstractmethod
    async def backfill(self) -> int:
        """Index the records of a database made before ``about``'s index; answers how many."""

    @abstractmethod
    async def head(self) -> Head:
        """The newest record's seq and hash."""

    @abstractmethod
    async def at_seq(self, seq: int) -> AuditRecord | None:
        """The record with this seq, if there is one."""

    async def seal(self, now: float) -> AuditRecord | None:
        """With a key, close a prefix of records written without one (the first start with a
        key): append an ``audit.seal`` record naming its last seq and hash. None when there is
        nothing to seal: no key, an empty log, or a newest record already keyed."""
        if self.key is None:
            return None
        last = await self.records(since_seq=max(0, (await self.head()).seq - 1))
        if not last or _recomputed(last[-1], self.key) == last[-1].hash:
            return None
        sealed = {SEALED_SEQ: last[-1].seq, SEALED_HASH: last[-1].hash}
        reason = "the records up to this one were written before the audit log had a key"
        return await self.append(SEALER, "control", SEAL, "audit", "ok", reason, sealed, now=now)

    @abstractmethod
    async def aclose(self) -> None: ...


# -- hashing and verification ------------------------------------------------------------------


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, no NaN/Infinity: the same text for the same content."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def hash_of(record: AuditRecord, key: bytes | None = None) -> str:
    """What ``record.hash`` should be: the HMAC-SHA256 with ``key`` (without one, the SHA-256)
    of the canonical JSON of every other field."""
    return _digest({field: getattr(record, field) for field in COLUMNS if field != "hash"}, key)


def _digest(body: dict[str, Any], key: bytes | None) -> str:
    text = canonical_json(body).encode("utf-8")
    if key is None:
        return hashlib.sha256(text).hexdigest()
    return hmac.digest(key, text, "sha256").hex()


def _recomputed(record: AuditRecord, key: bytes | None) -> str | None:
    if record.malformed is not None:
        return None
    try:
        return hash_of(record, key)
    except (TypeError, ValueError):  # e.g. a time changed to NaN: not a valid record at all
        return None


#: Who writes the seal, its action, and the detail keys naming the sealed prefix's last record.
SEALER: Final = "haltwire"
SEAL: Final = "audit.seal"
SEALED_SEQ: Final = "sealed_seq"
SEALED_HASH: Final = "sealed_hash"


class Chain:
    """Checks a log from seq 1, one record at a time (``add``), so a long log is read in pages.

    ``add`` answers None while the log holds, else the failure (and every later ``add`` is
    ignored); ``result`` says how it ended. ``first_bad_seq`` is the seq of the changed or
    misplaced record, or for a removed record the seq that is missing; ``checked`` counts the
    records that passed.
    """

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key
        self.expected_seq, self.prev, self.checked = 1, GENESIS, 0
        #: Records hashed without the key and not yet closed by a seal (a keyed log only).
        self.unkeyed = 0
        self.sealed = 0
        self.failed: VerifyResult | None = None

    def _fail(self, seq: int, problem: str) -> VerifyResult:
        self.failed = VerifyResult(False, self.checked, seq, problem, self.expected_seq - 1, self.prev)
        return self.failed

    def add(self, record: AuditRecord) -> VerifyResult | None:
        if self.failed is not None:
            return self.failed
        expected = self.expected_seq
        if record.seq != expected:
            if record.seq > expected:
                missing = str(expected) + (f"..{record.seq - 1}" if record.seq > expected + 1 else "")
                return self._fail(
                    expected, f"seq gap: expected {expected}, found {record.seq} (record {missing} removed)"
                )
            return self._fail(
                record.seq,
                f"seq not increasing: expected {expected}, found {record.seq} (reordered or duplicated)",
            )
        if record.malformed is not None:
            return self._fail(record.seq, f"malformed record: {record.malformed}")
        keyed = _recomputed(record, self.key) == record.hash
        if not keyed and not (
            self.key is not None and self.checked == self.unkeyed and _recomputed(record, None) == record.hash
        ):
            problem = "hash mismatch: the record's fields were changed"
            if self.key is not None:
                problem += " (or it was written with another audit key)"
            return self._fail(record.seq, problem)
        if record.prev_hash != self.prev:
            before = "the genesis hash" if expected == 1 else f"the hash of seq {expected - 1}"
            return self._fail(
                record.seq,
                f"prev_hash mismatch: does not equal {before} (a record before it was changed or removed)",
            )
        if not keyed:
            self.unkeyed += 1
        elif self.unkeyed:
            sealed = record.action == SEAL and record.detail.get(SEALED_SEQ) == expected - 1
            if not (sealed and record.detail.get(SEALED_HASH) == self.prev):
                return self._fail(
                    expected - self.unkeyed,
                    f"records {expected - self.unkeyed}..{expected - 1} are not keyed and no seal closes them",
                )
            self.sealed, self.unkeyed = self.unkeyed, 0
        self.expected_seq, self.prev = expected + 1, record.hash
        self.checked += 1
        return None

    def result(self) -> VerifyResult:
        if self.failed is not None:
            return self.failed
        if self.unkeyed:
            first = self.expected_seq - self.unkeyed
            return self._fail(
                first,
                f"records {first}..{self.expected_seq - 1} are not keyed with this control plane's audit key",
            )
        return VerifyResult(True, self.checked, None, None, self.expected_seq - 1, self.prev, self.sealed)

    def expect(self, head: Head, found: AuditRecord | None) -> VerifyResult:
        """``result``, failed unless ``found`` (the record at ``head.seq``, read from the log)
        still has the hash a verifier held for it."""
        result = self.result()
        if not result.ok or head.seq == 0:
            return result
        if found is None or found.seq != head.seq:
            end = f"the log ends at seq {result.head_seq}" if result.head_seq < head.seq else "it is missing"
            return self._fail(
                head.seq, f"the held head's record {head.seq} is gone ({end}): the log was shortened"
            )
        if found.hash != head.hash:
            return self._fail(
                head.seq, f"record {head.seq} no longer has the held head's hash: the log was rewritten"
            )
        return result


def verify(records: Iterable[AuditRecord], key: bytes | None = None) -> VerifyResult:
    """Check a whole log from seq 1, in the given order; stops at the first bad record."""
    chain = Chain(key)
    for record in records:
        if chain.add(record) is not None:
            break
    return chain.result()


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
    "at_seq": f"SELECT {_COLS} FROM {{audit}} WHERE seq = ?",
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


def new_record(last: Row | None, fields: Fields, now: float, key: bytes | None = None) -> AuditRecord:
    """The record after ``last`` (a ``(seq, hash)`` row, or None for an empty log)."""
    actor, role, action, target, outcome, reason, detail = fields
    seq, prev_hash = (1, GENESIS) if last is None else (int(last[0]) + 1, str(last[1]))
    # The detail as it will read back from the store, so the hash is over the stored content.
    stored_detail: dict[str, Any] = json.loads(detail)
    # ``hash_of``'s body, built once (no record to copy: an append is on every write's path).
    body: dict[str, Any] = {
        "seq": seq, "at": now, "actor": actor, "role": role, "action": action, "target": target,
        "outcome": outcome, "reason": reason, "detail": stored_detail, "prev_hash": prev_hash,
    }  # fmt: skip
    return AuditRecord(**body, hash=_digest(body, key))


def checked_append(
    actor: str, action: str, outcome: str, detail: Mapping[str, Any], now: float
) -> tuple[Outcome, str]:
    """Validate an append request before touching the store; answers the outcome typed and the
    detail's canonical JSON (what is stored)."""
    if not actor.strip():
        raise ValueError("an audit record needs an actor")
    if not action.strip():
        raise ValueError("an audit record needs an action")
    if outcome not in ("ok", "refused"):
        raise ValueError(f"outcome must be 'ok' or 'refused', not {outcome!r}")
    if not math.isfinite(now):
        raise ValueError("now must be a finite time")
    stored = canonical_json(dict(detail))  # raises TypeError / ValueError when not JSON
    return cast(Outcome, outcome), stored


def as_row(record: AuditRecord, detail: str) -> tuple[object, ...]:
    """The record's column values in ``COLUMNS`` order, ``detail`` its canonical JSON."""
    return row_of(record, COLUMNS, detail=lambda _: detail)


def from_row(row: Row) -> AuditRecord:
    """A record as stored; never raises. A detail that is not a JSON object is kept (wrapped)
    and a time that is not a finite number is marked ``malformed`` (``at`` 0), so ``verify``
    reports the record as tampered at its seq, and listings show it, instead of failing."""
    seq, at, actor, role, action, target, outcome, reason, detail, prev_hash, digest = row
    try:
        parsed = json.loads(detail)
    except (TypeError, ValueError):
        parsed = None
    parsed_detail: dict[str, Any] = (
        parsed if isinstance(parsed, dict) else {"<unreadable detail>": str(detail)}
    )
    malformed = None
    try:
        when = float(at)
    except (TypeError, ValueError):
        when = math.nan
    if not math.isfinite(when) or isinstance(at, (str, bytes)):
        malformed, when = f"at is not a time: {str(at)[:64]!r}", 0.0
    return AuditRecord(
        seq=int(seq),
        at=when,
        actor=str(actor),
        role=str(role),
        action=str(action),
        target=str(target),
        outcome=cast(Outcome, str(outcome)),  # as stored: a changed value fails ``verify``
        reason=str(reason),
        detail=parsed_detail,
        prev_hash=str(prev_hash),
        hash=str(digest),
        malformed=malformed,
    )


__all__ = [
    "COLUMNS",
    "GENESIS",
    "AuditLog",
    "AuditRecord",
    "Chain",
    "Head",
    "Outcome",
    "RegistryUnavailable",
    "VerifyResult",
    "canonical_json",
    "hash_of",
    "verify",
]
