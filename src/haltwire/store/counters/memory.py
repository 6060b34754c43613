"""In-memory counters for a single gateway process.

Correct only while one process enforces the limits: three gateways each counting in
memory allow three times the budget (``tests/test_redis_counters.py`` shows it on
purpose). Atomic because the event loop runs one ``admit`` at a time and it never awaits.
"""

from __future__ import annotations

from collections.abc import Sequence

from haltwire.store.counters import ADMITTED, BudgetCounter, Decision, SlotCounter


class MemoryCounters:
    def __init__(self) -> None:
        # key -> (window number, calls counted in it); one entry per key, so memory stays bounded.
        self._budgets: dict[str, tuple[int, int]] = {}
        self._slots: dict[str, int] = {}

    async def admit(
        self, budgets: Sequence[BudgetCounter], slots: Sequence[SlotCounter], slot_id: str, now: float
    ) -> Decision:
        for i, b in enumerate(budgets):
            window, used = self._budgets.get(b.key, (b.window, 0))
            if window == b.window and used >= b.limit:
                return Decision(("budget", i))
        for i, s in enumerate(slots):
            if self._slots.get(s.key, 0) >= s.limit:
                return Decision(("slots", i))
        for b in budgets:
            window, used = self._budgets.get(b.key, (b.window, 0))
            self._budgets[b.key] = (b.window, used + 1 if window == b.window else 1)
        for s in slots:
            self._slots[s.key] = self._slots.get(s.key, 0) + 1
        return ADMITTED

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        for s in slots:
            left = self._slots.get(s.key, 0) - 1
            if left > 0:
                self._slots[s.key] = left
            else:
                self._slots.pop(s.key, None)

    def in_flight(self, key: str) -> int:
        return self._slots.get(key, 0)

    async def aclose(self) -> None:
        return None
