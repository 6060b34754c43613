"""Counter stores: where budgets, in-flight slots and the tripwires' counts are counted.

The admission policy (``haltwire.gateway.ceilings``) decides *what* to count and the limits;
a store only counts, atomically: one ``admit`` checks every counter it is given and
either takes all of them or none. A new backend is one module implementing
``CounterStore``; the policy never changes when the store does.

A counter's key starts with its owner, ``OWNER:...`` (an identity's ``counted_as``, or a
tenant's or an agent's for what is counted across identities, ``haltwire.identity``). On Redis
Cluster an admission is one atomic script per owner, and a refusal by a later one gives back
what the earlier took: still all or nothing, never past a limit, but not one instant
(``parts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio.abc


class CountersUnavailable(Exception):
    """The store could not be reached or did not answer in time. Callers fail closed."""


@dataclass(frozen=True, slots=True)
class BudgetCounter:
    """Calls counted in one fixed window. ``window`` numbers the window; a new number starts at 0."""

    key: str
    window: int
    limit: int
    window_ends_at: float


@dataclass(frozen=True, slots=True)
class SlotCounter:
    """Calls in flight. A slot taken by ``admit`` is given back by ``release``."""

    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Decision:
    """``refused``: None when admitted, else which counter refused, ``("budget", i)``, ``("slots", i)``
    or ``("tally", i)``. ``tallied``: each tally op's count, after it when admitted, as it was when not."""

    refused: tuple[str, int] | None = None
    tallied: tuple[int, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.refused is None


ADMITTED = Decision()


@dataclass(frozen=True, slots=True)
class Tally:
    """Add ``amount`` to a count; with a ``limit``, refuse (add nothing anywhere) if it would go past it.
    An ``amount`` of 0 only checks (``limit`` 0: refused once the count is 1): nothing is written."""

    key: str
    amount: int
    limit: int | None
    ttl_s: float


@dataclass(frozen=True, slots=True)
class Streak:
    """Outcomes in a row: a hit adds one, anything else sets it back to 0."""

    key: str
    hit: bool
    ttl_s: float


@dataclass(frozen=True, slots=True)
class Repeat:
    """The same ``digest`` in a row: the same as last time adds one, another starts again at 1."""

    key: str
    digest: str
    ttl_s: float


TallyOp = Tally | Streak | Repeat


@dataclass(frozen=True, slots=True)
class Tallies:
    """What ``tally`` did: ``refused``, the index of the ``Tally`` that would have gone past its
    limit (then nothing was counted, and ``values`` are the counts as they were); else None, and
    ``values`` are each op's count after it."""

    values: tuple[int, ...]
    refused: int | None = None


class CounterStore(Protocol):
    #: ``release`` never waits (an in-process store): no cancellation can cut it short, so it
    #: needs no shield, and the caller spares every call the shield's timer.
    releases_at_once: bool

    async def admit(
        self,
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp] = (),
    ) -> Decision:
        """Check every counter (and every limited ``Tally``); if all have room, count the call in
        each budget, take a slot in each, and apply every tally op. One round trip (on Redis
        Cluster, one per owner of the counters)."""
        ...

    async def tally(self, ops: Sequence[TallyOp], now: float) -> Tallies:
        """``admit`` with tally ops only (the tripwires' judgement of an outcome)."""
        ...

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        """Give back the slots ``admit`` took under ``slot_id``.

        A store that cannot give them back now either retries on its own (see ``start``) or
        raises ``CountersUnavailable``.
        """
        ...

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Get ready for the first calls (a shared store gives its server its scripts, ``warm``)
        and start the store's background work in ``tg`` (which owns it), if it has any."""
        ...

    async def aclose(self) -> None: ...


__all__ = [
    "ADMITTED",
    "BudgetCounter",
    "CounterStore",
    "CountersUnavailable",
    "Decision",
    "Repeat",
    "SlotCounter",
    "Streak",
    "Tallies",
    "Tally",
    "TallyOp",
]
