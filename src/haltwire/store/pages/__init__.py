"""The page outbox: every page the control plane owes a receiver, until it is delivered or given up
(table ``pages``, in the registry's database).

A page is written in the same transaction as the change it reports (a stop, its audit record and
its pages commit together), so a page is never lost to a crash between the commit and the send,
and never sent for a change that rolled back. One row per receiver (``target``), so a receiver
that is down delays only its own pages. The sender (``haltwire.control.notify``) claims a due row
for a while (``claimed_until``: another replica skips it meanwhile), posts it, and settles it:
``delivered``, or ``pending`` again with a later ``next_at``, or ``given_up``; past a receiver's
cap of pending pages the oldest are ``dropped``. Rows are kept: they are the delivery history.

The DDL and the queries are written once here (``?`` placeholders, ``{pages}`` for the table);
``tables.SqlPageStore`` runs them on either backend. Failures raise ``RegistryUnavailable``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, cast

from haltwire.store.registry import RegistryUnavailable

PageState = Literal["pending", "delivered", "given_up", "dropped"]

COLUMNS: Final = (
    "page_id",
    "target",
    "event",
    "subject",
    "facts",
    "created_at",
    "state",
    "attempts",
    "next_at",
    "claimed_until",
    "settled_at",
)


@dataclass(frozen=True, slots=True)
class PageRecord:
    """One page owed to one receiver. ``facts``: what the event said (the stop's id, scope,
    reason...), from which the sender builds the page when it sends it."""

    page_id: str
    target: str
    event: str
    subject: str
    facts: dict[str, Any]
    created_at: float
    state: PageState = "pending"
    attempts: int = 0
    next_at: float = 0.0
    claimed_until: float = 0.0
    settled_at: float | None = None


class PageStore(Protocol):
    async def add(self, pages: Sequence[PageRecord]) -> None:
        """Write pages (inside the caller's transaction when one is open)."""
        ...

    async def head(self, target: str) -> PageRecord | None:
        """``target``'s oldest pending page: pages go to one receiver in order."""
        ...

    async def claim(self, page_id: str, now: float, until: float) -> bool:
        """Claim a pending page no one else holds until ``until``; False when it is not (another
        replica claimed or settled it meanwhile)."""
        ...

    async def settle(self, page_id: str, state: PageState, attempts: int, next_at: float, at: float) -> None:
        """Record an attempt's end: ``delivered``, ``given_up``, or ``pending`` until ``next_at``."""
        ...

    async def pending(self, target: str) -> int:
        """How many pages wait for ``target``."""
        ...

    async def drop_oldest(self, target: str, keep: int, at: float) -> list[str]:
        """Mark ``target``'s oldest pending pages past the newest ``keep`` ``dropped``; their ids."""
        ...

    async def get(self, page_id: str) -> PageRecord | None: ...

    async def for_subject(self, subject: str) -> list[PageRecord]:
        """Every page about ``subject`` (a stop id), oldest first (a scan: not for the hot path)."""
        ...


_COLS = ", ".join(COLUMNS)

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {pages} (
    page_id       TEXT PRIMARY KEY,
    target        TEXT NOT NULL,
    event         TEXT NOT NULL,
    subject       TEXT NOT NULL,
    facts         TEXT NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    state         TEXT NOT NULL,
    attempts      INTEGER NOT NULL,
    next_at       DOUBLE PRECISION NOT NULL,
    claimed_until DOUBLE PRECISION NOT NULL,
    settled_at    DOUBLE PRECISION
)""",
    # The one index: a receiver's pending pages in order. A stop pays for each B-tree its pages
    # touch (this, the table and its key), so ``for_subject`` (tests, tools) scans instead.
    "CREATE INDEX IF NOT EXISTS pages_due ON {pages} (target, state, created_at, page_id)",
)

_ORDER = "ORDER BY created_at, page_id"

QUERIES: Final = {
    "add": f"INSERT INTO {{pages}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)})",
    "head": f"SELECT {_COLS} FROM {{pages}} WHERE target = ? AND state = 'pending' {_ORDER} LIMIT 1",
    "claim": "UPDATE {pages} SET claimed_until = ? WHERE page_id = ? AND state = 'pending' "
    "AND claimed_until <= ? RETURNING page_id",
    "settle": "UPDATE {pages} SET state = ?, attempts = ?, next_at = ?, claimed_until = 0, "
    "settled_at = ? WHERE page_id = ?",
    "count": "SELECT COUNT(*) FROM {pages} WHERE target = ? AND state = 'pending'",
    "pending": "SELECT page_id FROM {pages} WHERE target = ? AND state = 'pending' "
    "ORDER BY created_at DESC, page_id DESC",
    "drop": "UPDATE {pages} SET state = 'dropped', settled_at = ? WHERE page_id = ? AND state = 'pending'",
    "get": f"SELECT {_COLS} FROM {{pages}} WHERE page_id = ?",
    "for_subject": f"SELECT {_COLS} FROM {{pages}} WHERE subject = ? {_ORDER}",
}


def as_row(p: PageRecord) -> tuple[object, ...]:
    return (
        p.page_id,
        p.target,
        p.event,
        p.subject,
        json.dumps(p.facts, sort_keys=True, separators=(",", ":")),
        p.created_at,
        p.state,
        p.attempts,
        p.next_at,
        p.claimed_until,
        p.settled_at,
    )


def from_row(row: Sequence[Any]) -> PageRecord:
    page_id, target, event, subject, facts, created, state, attempts, next_at, claimed, settled = row
    return PageRecord(
        str(page_id),
        str(target),
        str(event),
        str(subject),
        json.loads(facts),
        float(created),
        cast(PageState, str(state)),
        int(attempts),
        float(next_at),
        float(claimed),
        None if settled is None else float(settled),
    )


__all__ = ["PageRecord", "PageState", "PageStore", "RegistryUnavailable"]
