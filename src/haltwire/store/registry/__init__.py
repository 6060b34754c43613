"""The stop registry: stop records, kept as an append-only history of changes.

Every change (a stop issued, a stop cleared) is one row with the next revision number;
revisions are strictly increasing in commit order, so a watcher that has seen revision N
resumes with ``changes_since(N)`` and never misses a change. A stop's state is derived from
its changes: clearing appends a ``clear`` change and never rewrites the ``stop`` change.
The DDL, the queries (``?`` placeholders, ``{changes}`` for the table) and the row helpers are
written once here; ``tables.SqlRegistry`` is the registry over either SQL backend.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Final, Protocol

from haltwire.scope import Scope
from haltwire.stops import Change, ChangeKind, StopRecord, checked_reason

#: The columns of one change row, in this order, in every backend.
COLUMNS = ("revision", "kind", "stop_id", "scope", "reason", "actor", "at", "expires_at")

Row = Sequence[Any]


class RegistryUnavailable(Exception):
    """The store could not be reached or failed. Callers fail closed.

    ``written`` is False when nothing was written (the transaction rolled back, or nothing
    was being written), None when a write's COMMIT was sent and its answer lost: it may
    have been recorded."""

    def __init__(self, message: str, *, written: bool | None = False) -> None:
        super().__init__(message)
        self.written = written


class UnknownStop(LookupError):
    """No stop has this id."""


class AlreadyCleared(Exception):
    """The stop was cleared before; a clear is recorded once."""


class RequestConflict(Exception):
    """A request key already names a request with other content (another scope, reason, stop)."""


class Registry(Protocol):
    async def issue_stop(
        self, scope: str, reason: str, issued_by: str, *, now: float, expires_at: float | None = None
    ) -> StopRecord:
        """Record a new stop on ``scope``. Raises ``ScopeError`` or ``ValueError`` on bad input."""
        ...

    async def clear_stop(self, stop_id: str, cleared_by: str, reason: str, *, now: float) -> StopRecord:
        """Record who cleared a stop and why. Raises ``UnknownStop`` or ``AlreadyCleared``."""
        ...

    async def active_stops(self, *, now: float) -> list[StopRecord]:
        """Stops neither cleared nor expired at ``now``, oldest first."""
        ...

    async def get_stop(self, stop_id: str) -> StopRecord | None: ...

    async def all_stops(self) -> list[StopRecord]:
        """Every stop ever issued, cleared or not, oldest first."""
        ...

    async def stops_during(
        self, scopes: Collection[str], since: float, until: float | None
    ) -> list[StopRecord]:
        """The stops on one of ``scopes`` that may have been in force between ``since`` and
        ``until`` (None: still going): issued by ``until``, not cleared or expired before
        ``since``; oldest first. Read by scope and time, not the whole history."""
        ...

    async def stops_by_id(self, stop_ids: Collection[str]) -> list[StopRecord]:
        """The stops with these ids, oldest first (an unknown id is left out)."""
        ...

    async def changes_since(self, revision: int, *, limit: int = 1000) -> list[Change]:
        """Changes with a revision strictly greater than ``revision``, ascending."""
        ...

    async def revision(self) -> int:
        """The latest revision; 0 when nothing was ever recorded."""
        ...

    async def digests(self, after: int, limit: int) -> list[tuple[int, str]]:
        """``(revision, digest)`` of the changes after ``after`` as stored (``digest``), ascending:
        what the audit log's records of them must name."""
        ...

    async def requested(self, actor: str, key: str, fingerprint: str) -> str | None:
        """The stop an earlier request of ``actor`` with this key wrote (or cleared), or None.
        Takes the registry's write lock: call it in the write transaction that will answer the
        request. ``RequestConflict`` when the key came before with another ``fingerprint``."""
        ...

    async def remember(self, actor: str, key: str, fingerprint: str, stop_id: str) -> None:
        """Record that ``actor``'s request with this key wrote (or cleared) ``stop_id``."""
        ...

    async def follow_writes(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` whenever another process may have written; runs until cancelled.

        The control plane wakes its watchers on its own writes; this covers the writes of
        other replicas sharing the store.
        """
        ...

    async def aclose(self) -> None: ...


# -- shared by the backends -------------------------------------------------------------------

_COLS = ", ".join(COLUMNS)

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {changes} (
    revision   {integer_key},
    kind       TEXT NOT NULL CHECK (kind IN ('stop', 'clear')),
    stop_id    TEXT NOT NULL,
    scope      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    at         DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS changes_one_kind_per_stop ON {changes} (stop_id, kind)",
    # The escalation rules count the stops of a recent window (``haltwire.store.trips``).
    "CREATE INDEX IF NOT EXISTS changes_by_time ON {changes} (at)",
    # A run's report reads the stops on its scopes (``stops_during``); made on an existing file too.
    "CREATE INDEX IF NOT EXISTS changes_by_scope ON {changes} (scope, at)",
    # Idempotency keys of stop and clear requests: a retried request answers what the first did.
    """CREATE TABLE IF NOT EXISTS {requests} (
    actor       TEXT NOT NULL,
    request_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    stop_id     TEXT NOT NULL,
    PRIMARY KEY (actor, request_key)
)""",
)

QUERIES: Final = {
    "insert": f"INSERT INTO {{changes}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)})",
    "by_stop": f"SELECT {_COLS} FROM {{changes}} WHERE stop_id = ? ORDER BY revision",
    "active": f"SELECT {_COLS} FROM {{changes}} AS s "
    "WHERE s.kind = 'stop' AND (s.expires_at IS NULL OR s.expires_at > ?) "
    "AND NOT EXISTS (SELECT 1 FROM {changes} AS c WHERE c.stop_id = s.stop_id AND c.kind = 'clear') "
    "ORDER BY s.revision",
    # Each change with its stop's issuing change.
    "since": f"SELECT {', '.join('c.' + c for c in COLUMNS)}, {', '.join('s.' + c for c in COLUMNS)} "
    "FROM {changes} AS c JOIN {changes} AS s ON s.stop_id = c.stop_id AND s.kind = 'stop' "
    "WHERE c.revision > ? ORDER BY c.revision LIMIT ?",
    "latest": "SELECT COALESCE(MAX(revision), 0) FROM {changes}",
    "all": f"SELECT {_COLS} FROM {{changes}} ORDER BY revision",
    "page": f"SELECT {_COLS} FROM {{changes}} WHERE revision > ? ORDER BY revision LIMIT ?",
    "requested": "SELECT fingerprint, stop_id FROM {requests} WHERE actor = ? AND request_key = ?",
    "remember": "INSERT INTO {requests} (actor, request_key, fingerprint, stop_id) VALUES (?, ?, ?, ?)",
}


def _marks(count: int) -> str:
    return ", ".join("?" for _ in range(count))


def during_query(scopes: int, bounded: bool) -> str:
    """Both changes of the stops on one of ``scopes`` scopes in force at some moment of a window
    (``{changes}`` unbound). Parameters: the scopes, the window's end if ``bounded``, its start
    twice (not expired before it, not cleared before it)."""
    until = " AND s.at <= ?" if bounded else ""
    return (
        f"SELECT {_COLS} FROM {{changes}} WHERE stop_id IN (SELECT s.stop_id FROM {{changes}} AS s "
        f"WHERE s.kind = 'stop' AND s.scope IN ({_marks(scopes)}){until} "
        "AND (s.expires_at IS NULL OR s.expires_at >= ?) AND NOT EXISTS (SELECT 1 FROM {changes} AS c "
        "WHERE c.stop_id = s.stop_id AND c.kind = 'clear' AND c.at < ?)) ORDER BY revision"
    )


def by_ids_query(count: int) -> str:
    """Every change of the stops with ``count`` ids (``{changes}`` unbound)."""
    return f"SELECT {_COLS} FROM {{changes}} WHERE stop_id IN ({_marks(count)}) ORDER BY revision"


def digest(row: Row) -> str:
    """A change's digest: the SHA-256 of the canonical JSON of its columns, as stored."""
    revision, kind, stop_id, scope, reason, actor, at, expires_at = row
    try:
        values = [int(revision), kind, stop_id, scope, reason, actor, float(at)]
        values.append(None if expires_at is None else float(expires_at))
        text = json.dumps(values, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError):  # a row edited into something no change is: it matches nothing
        text = "unreadable " + repr(tuple(row))
    return hashlib.sha256(text.encode()).hexdigest()


def issue_row(stop: StopRecord) -> Row:
    """The ``stop`` change that recorded ``stop``, as stored."""
    return (
        stop.revision,
        "stop",
        stop.stop_id,
        stop.scope,
        stop.reason,
        stop.issued_by,
        stop.issued_at,
        stop.expires_at,
    )


def clear_row(stop: StopRecord) -> Row:
    """The ``clear`` change of a cleared ``stop``, as stored."""
    return (
        stop.cleared_revision,
        "clear",
        stop.stop_id,
        stop.scope,
        stop.clear_reason,
        stop.cleared_by,
        stop.cleared_at,
        None,
    )


def new_stop_id() -> str:
    return "stp_" + secrets.token_hex(8)


def checked_issue(scope: str, reason: str, issued_by: str) -> str:
    """Validate an issue request; answers the scope as stored."""
    parsed = Scope.parse(scope)
    checked_reason(reason)
    if not issued_by.strip():
        raise ValueError("a stop needs an issuer")
    return str(parsed)


def checked_clear(cleared_by: str, reason: str) -> None:
    checked_reason(reason, "clearing a stop")
    if not cleared_by.strip():
        raise ValueError("clearing a stop needs who clears it")


def issued(row: Row) -> StopRecord:
    """The stop as its ``stop`` change recorded it."""
    revision, kind, stop_id, scope, reason, actor, at, expires_at = row
    if kind != "stop":
        raise ValueError(f"revision {revision} is a {kind!r} change, not a stop")
    return StopRecord(
        stop_id=str(stop_id),
        scope=str(scope),
        reason=str(reason),
        issued_by=str(actor),
        issued_at=float(at),
        expires_at=None if expires_at is None else float(expires_at),
        revision=int(revision),
    )


def with_clear(stop: StopRecord, row: Row) -> StopRecord:
    """``stop`` after its ``clear`` change."""
    revision, _kind, _stop_id, _scope, reason, actor, at, _expires_at = row
    return replace(
        stop,
        cleared_by=str(actor),
        cleared_at=float(at),
        clear_reason=str(reason),
        cleared_revision=int(revision),
    )


def fold(rows: Sequence[Row]) -> StopRecord | None:
    """A stop's state from its changes in revision order; None when there are none."""
    stop: StopRecord | None = None
    for row in rows:
        stop = issued(row) if row[1] == "stop" else with_clear(_must(stop, row), row)
    return stop


def fold_all(rows: Sequence[Row]) -> list[StopRecord]:
    """Every stop's state from the whole history in revision order, oldest stop first."""
    by_stop: dict[str, list[Row]] = {}
    for row in rows:
        by_stop.setdefault(str(row[2]), []).append(row)
    return [stop for changes in by_stop.values() if (stop := fold(changes)) is not None]


def clearable(rows: Sequence[Row], stop_id: str) -> StopRecord:
    """The stop ``stop_id`` if it can be cleared, else ``UnknownStop`` / ``AlreadyCleared``."""
    stop = fold(rows)
    if stop is None:
        raise UnknownStop(stop_id)
    if stop.cleared:
        raise AlreadyCleared(f"{stop_id} was cleared at revision {stop.cleared_revision}")
    return stop


def change(row: Row, issuing_row: Row) -> Change:
    """A change from its row and its stop's issuing row (the same row for a ``stop`` change)."""
    stop = issued(issuing_row)
    kind: ChangeKind = "stop" if row[1] == "stop" else "clear"
    return Change(int(row[0]), kind, stop if kind == "stop" else with_clear(stop, row))


def _must(stop: StopRecord | None, row: Row) -> StopRecord:
    if stop is None:
        raise ValueError(f"revision {row[0]} clears a stop that was never issued")
    return stop


__all__ = [
    "COLUMNS",
    "AlreadyCleared",
    "Change",
    "ChangeKind",
    "Registry",
    "RegistryUnavailable",
    "RequestConflict",
    "StopRecord",
    "UnknownStop",
]
