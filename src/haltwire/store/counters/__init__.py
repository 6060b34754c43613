"""Counter stores: where budgets and in-flight slots are counted.

The admission policy (``haltwire.gateway.ceilings``) decides *what* to count and the limits;
a store only counts, atomically: one ``admit`` checks every counter it is given and
either takes all of them or none. A new backend is one module implementing
``CounterStore``; the policy never changes when the store does.
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
    """``refused``: None when admitted, else which counter refused, ``("budget", i)`` or ``("slots", i)``."""

    refused: tuple[str, int] | None = None

    @property
    def admitted(self) -> bool:
        return self.refused is None


ADMITTED = Decision()


class CounterStore(Protocol):
    async def admit(
        self, budgets: Sequence[BudgetCounter], slots: Sequence[SlotCounter], slot_id: str, now: float
    ) -> Decision:
        """Check every counter; if all have room, count the call in each budget and take a slot in each."""
        ...

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        """Give back the slots ``admit`` took under ``slot_id``.

        A store that cannot give them back now either retries on its own (see ``start``) or
        raises ``CountersUnavailable``.
        """
        ...

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the store's background work in ``tg`` (which owns it), if it has any."""
        ...

    async def aclose(self) -> None: ...


__all__ = [
    "ADMITTED",
    "BudgetCounter",
    "CounterStore",
    "CountersUnavailable",
    "Decision",
    "SlotCounter",
]
