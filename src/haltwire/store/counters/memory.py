"""In-memory counters for a single gateway process.

Correct only while one process enforces the limits: three gateways each counting in
memory allow three times the budget (``tests/test_redis_gateways.py`` shows it on
purpose). Atomic because the event loop runs one ``admit`` at a time and it never awaits.

Same semantics as the Redis store: each window number has its own count (a late call
stamped with the previous window counts there and never resets the current one), and a
slot is held by its ``slot_id``, so releasing twice, or releasing an id that holds
nothing, gives back no one else's slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio.abc

from haltwire.store.counters import (
    ADMITTED,
    BudgetCounter,
    Decision,
    Repeat,
    SlotCounter,
    Streak,
    Tallies,
    Tally,
    TallyOp,
)

_SWEEP_EVERY = 4096
_GRACE_S = 60.0


class MemoryCounters:
    releases_at_once = True  # ``release`` awaits nothing

    def __init__(self) -> None:
        # key -> {window number: calls counted in it}; only the newest two windows of a key
        # are kept, so memory stays bounded.
        self._budgets: dict[str, dict[int, int]] = {}
        # key -> when its newest window ends; keys whose windows are over are swept now and
        # then, so per-run keys (one per run) do not pile up for the life of the process.
        self._ends: dict[str, float] = {}
        self._admits = 0
        # key -> ids of the admissions holding a slot.
        self._slots: dict[str, set[str]] = {}
        # Tripwire counts: key -> (count, digest of a Repeat, expires at); swept like budgets.
        self._tallies: dict[str, tuple[int, str, float]] = {}
        self._tallied = 0

    async def admit(
        self,
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp] = (),
    ) -> Decision:
        current = self._tallied_now(tallies, now)
        was = tuple(c for c, _ in current)
        for i, b in enumerate(budgets):
            if self._budgets.get(b.key, {}).get(b.window, 0) >= b.limit:
                return Decision(("budget", i), was)
        for i, s in enumerate(slots):
            if len(self._slots.get(s.key, ())) >= s.limit:
                return Decision(("slots", i), was)
        for i, op in enumerate(tallies):
            if isinstance(op, Tally) and op.limit is not None and current[i][0] + op.amount > op.limit:
                return Decision(("tally", i), was)
        for b in budgets:
            counts = self._budgets.setdefault(b.key, {})
            counts[b.window] = counts.get(b.window, 0) + 1
            newest = max(counts)
            for old in [w for w in counts if w < newest - 1]:
                del counts[old]
            self._ends[b.key] = max(self._ends.get(b.key, 0.0), b.window_ends_at)
        self._admits += 1
        if self._admits % _SWEEP_EVERY == 0:
            self._sweep(now)
        for s in slots:
            self._slots.setdefault(s.key, set()).add(slot_id)
        if not tallies:
            return ADMITTED
        return Decision(None, self._apply(tallies, current, now))

    async def tally(self, ops: Sequence[TallyOp], now: float) -> Tallies:
        decision = await self.admit((), (), "", now, ops)
        refused = None if decision.refused is None else decision.refused[1]
        return Tallies(decision.tallied, refused)

    def _tallied_now(self, ops: Sequence[TallyOp], now: float) -> list[tuple[int, str]]:
        current: list[tuple[int, str]] = []
        for op in ops:
            entry = self._tallies.get(op.key)
            current.append((0, "") if entry is None or entry[2] <= now else (entry[0], entry[1]))
        return current

    def _apply(self, ops: Sequence[TallyOp], current: list[tuple[int, str]], now: float) -> tuple[int, ...]:
        held = self._tallies
        values: list[int] = []
        for op, (count, seen) in zip(ops, current, strict=True):
            if isinstance(op, Tally) and op.amount == 0:
                values.append(count)  # a check only: nothing is written
                continue
            if isinstance(op, Tally):
                count, seen = count + op.amount, ""
            elif isinstance(op, Streak):
                count = count + 1 if op.hit else 0
            else:
                assert isinstance(op, Repeat)
                count, seen = (count + 1 if seen == op.digest else 1), op.digest
            held[op.key] = (count, seen, now + op.ttl_s)
            values.append(count)
        self._tallied += 1
        if self._tallied % _SWEEP_EVERY == 0:
            for key in [k for k, (_, _, ends) in held.items() if ends <= now]:
                del held[key]
        return tuple(values)

    def _sweep(self, now: float) -> None:
        # A window over for a minute cannot be counted in again: a late call is late by
        # microseconds (the window is stamped just before admit), not by a minute.
        for key in [k for k, ends in self._ends.items() if ends < now - _GRACE_S]:
            del self._ends[key]
            self._budgets.pop(key, None)

    def __len__(self) -> int:
        """How many budget keys are held."""
        return len(self._budgets)

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        for s in slots:
            held = self._slots.get(s.key)
            if held is None:
                continue
            held.discard(slot_id)
            if not held:
                del self._slots[s.key]

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        return None  # nothing runs in the background: a release here cannot fail

    def in_flight(self, key: str) -> int:
        return len(self._slots.get(key, ()))

    async def aclose(self) -> None:
        return None
