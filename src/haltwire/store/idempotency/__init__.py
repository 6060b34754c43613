"""Idempotency stores: where the outcome of each keyed call is kept.

The policy (``haltwire.gateway.idempotency``) decides which calls carry a key, derives keys
and turns answers into results or refusals; a store only remembers, atomically: one
``begin`` either claims a key for a call or says what the key already holds. A new backend
is one module implementing ``IdempotencyStore``; the policy never changes when the store does.

A key's record is its fingerprint (what the first call was) and, once the call has
answered, its outcome (JSON text the policy wrote). A record is kept ``ttl_s`` from the
``begin`` that created it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import anyio.abc


class IdempotencyUnavailable(Exception):
    """The store could not be reached or did not answer in time. Callers fail closed."""


@dataclass(frozen=True, slots=True)
class Fresh:
    """The key was free and is now claimed for this call: make the call, then ``complete``."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """The key's first call answered; ``outcome`` is what ``complete`` recorded."""

    outcome: str


@dataclass(frozen=True, slots=True)
class InFlight:
    """The key's first call has not recorded an outcome: still running, or never will (a crash)."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """The key was first used with a different fingerprint."""


Begun = Fresh | Recorded | InFlight | Conflict

FRESH = Fresh()
IN_FLIGHT = InFlight()
CONFLICT = Conflict()


class IdempotencyStore(Protocol):
    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        """Claim ``scope_key`` for a call with ``fingerprint``, or say what it already holds.

        A different fingerprint is a ``Conflict`` whatever the first call's state.
        """
        ...

    async def complete(self, scope_key: str, outcome: str) -> None:
        """Record the outcome of the call that got ``Fresh``; the record keeps its expiry."""
        ...

    async def release(self, scope_key: str) -> None:
        """Free a key whose call certainly did not happen (nothing recorded yet)."""
        ...

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the store's background work in ``tg`` (which owns it), if it has any."""
        ...

    async def aclose(self) -> None: ...


__all__ = [
    "CONFLICT",
    "FRESH",
    "IN_FLIGHT",
    "Begun",
    "Conflict",
    "Fresh",
    "IdempotencyStore",
    "IdempotencyUnavailable",
    "InFlight",
    "Recorded",
]
