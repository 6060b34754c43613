"""Ceilings: the admission policy. Which counters a call must fit in, and what to say when it doesn't.

Policy only: the counting itself is a ``CounterStore`` (``haltwire.store.counters``),
so the same policy runs on in-memory counters for one gateway and on Redis for many.

An identity is an agent id, a tenant and a version: two versions of one agent (a canary beside
the stable one) count apart, each against the limits of its own ``[[identities]]`` entry, so a
runaway canary cannot spend the stable version's budget. A call to tool T by identity A must fit in:

- A's call budget: N calls per fixed window (the refusal names when the window resets);
- A's budget for T, when one is configured;
- A's cap on calls in flight, and A's cap for T, when configured;
- for a call in a run (one that presented a lease), the run's step budget (``run_steps``):
  calls in the whole run, a budget keyed by run id in one long window.

All counters are checked and taken in one atomic ``admit`` (with the tripwires' admission
counts of the call, when there are any); a refused call consumes nothing. The window is fixed rather than sliding, so the reset time is one value the
refusal can state.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from haltwire import refusal
from haltwire.config import Label
from haltwire.gateway.config import GatewayConfig, LimitsOverride, ToolLimits
from haltwire.identity import Identity, IdentityKey
from haltwire.refusal import Refusal
from haltwire.store.counters import (
    BudgetCounter,
    CounterStore,
    CountersUnavailable,
    SlotCounter,
    Tallies,
    TallyOp,
)

Clock = Callable[[], float]
#: A tool's label (``haltwire.upstreams.labels``), or None for a tool the gateway does not know.
LabelOf = Callable[[str], Label | None]

#: How long a run's step count is kept after the run's first call. A budget window like any
#: other, only long: far past any lease (a lease is seconds to minutes and a run must keep
#: renewing one), so a run's count cannot lapse and restart while the run is alive.
RUN_WINDOW_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class ToolCeilings:
    """The effective limits for one (identity's entry, tool) pair, resolved once and cached.

    ``deadline_s`` is the smaller of the limits' deadline and the tool label's.
    """

    budget: int | None
    window_s: float
    max_in_flight: int | None
    deadline_s: float
    tool_budget: int | None
    tool_max_in_flight: int | None
    run_steps: int | None = None


@dataclass(slots=True)
class Ticket:
    """An admitted call. ``release`` gives back its slots; call it in ``finally``.

    ``tallied``: the tripwires' counts taken with the admission (``Ceilings.admit``'s ``tallies``);
    when one of them refused (``tallied.refused``), nothing was taken and the tripwires refuse."""

    store: CounterStore
    slots: tuple[SlotCounter, ...]
    slot_id: str
    deadline_s: float
    tallied: Tallies | None = None

    async def release(self) -> None:
        if self.slots:
            await self.store.release(self.slots, self.slot_id)


def _first(*values: float | int | None) -> float | int | None:
    return next((v for v in values if v is not None), None)


class Ceilings:
    def __init__(
        self,
        config: GatewayConfig,
        store: CounterStore,
        *,
        clock: Clock = time.time,
        labels: LabelOf | None = None,
    ) -> None:
        self._config = config
        self._labels = labels
        self._store = store
        self._clock = clock
        self._overrides: dict[IdentityKey, LimitsOverride] = {
            i.identity().key: i.limits for i in config.identities
        }
        #: Every identity from the ``[issuer]`` has its limits (and one cache entry per tool).
        self._issued = config.issuer.limits if config.issuer is not None else LimitsOverride()
        self._cache: dict[tuple[IdentityKey | None, str], ToolCeilings] = {}
        self._please_try_again = config.gateway.refusal_style == "please-try-again"
        # Slot ids must be unique across every gateway sharing a store: a random prefix per
        # process and a counter (a uuid4 per call costs about half of an in-memory admission).
        self._slot_prefix = uuid.uuid4().hex[:16]
        self._slot_numbers = itertools.count()

    @property
    def store(self) -> CounterStore:
        return self._store

    def for_call(self, identity: Identity, tool: str) -> ToolCeilings:
        """Merge defaults, the default tool override, the identity and the identity's tool override."""
        key = identity.key if identity.issuer is None else None
        found = self._cache.get((key, tool))
        if found is not None:
            return found
        d = self._config.limits
        ident = self._issued if key is None else self._overrides.get(key, LimitsOverride())
        dt = d.tools.get(tool, ToolLimits())
        it = ident.tools.get(tool, ToolLimits())
        deadline_s = float(_first(it.deadline_s, dt.deadline_s, ident.deadline_s, d.deadline_s) or 30.0)
        label = self._labels(tool) if self._labels is not None else None
        if label is not None:
            # The label's deadline is a hard bound: limits may shorten it, never extend it.
            deadline_s = min(deadline_s, self._config.labels.deadline_s(label))
        resolved = ToolCeilings(
            budget=_int(_first(ident.budget, d.budget)),
            window_s=float(_first(ident.window_s, d.window_s) or d.window_s),
            max_in_flight=_int(_first(ident.max_in_flight, d.max_in_flight)),
            deadline_s=deadline_s,
            tool_budget=_int(_first(it.budget, dt.budget)),
            tool_max_in_flight=_int(_first(it.max_in_flight, dt.max_in_flight)),
            run_steps=_int(_first(ident.run_steps, d.run_steps)),
        )
        self._cache[(key, tool)] = resolved
        return resolved

    async def admit(
        self,
        identity: Identity,
        tool: str,
        run: str | None = None,
        tallies: Sequence[TallyOp] = (),
        step: bool = True,
    ) -> Ticket | Refusal:
        """Admit one call (in ``run``, when it presented a lease) or say why not.

        ``tallies``: the tripwires' counts of the call (``haltwire.tripwires.engine``), checked and
        taken in the same atomic admission (one round trip), all or nothing with the counters.
        ``step`` false: the call is no step of the identity's budget nor of the run's (a model
        configured so); its tool's budget and the in-flight caps still apply.
        Fails closed when the counters cannot be reached.
        """
        c = self.for_call(identity, tool)
        now = self._clock()
        window = int(now // c.window_s)
        ends = (window + 1) * c.window_s
        counted = identity.counted_as
        budgets: list[BudgetCounter] = []
        if step and c.budget is not None:
            budgets.append(BudgetCounter(f"{counted}:b", window, c.budget, ends))
        if c.tool_budget is not None:
            budgets.append(BudgetCounter(f"{counted}:b:{tool}", window, c.tool_budget, ends))
        if step and run is not None and c.run_steps is not None:
            # Keyed under the identity (one Redis Cluster slot with its other counters); window 0
            # for the run's whole life, kept RUN_WINDOW_S from its first call.
            budgets.append(BudgetCounter(f"{counted}:r:{run}", 0, c.run_steps, now + RUN_WINDOW_S))
        slots: list[SlotCounter] = []
        if c.max_in_flight is not None:
            slots.append(SlotCounter(f"{counted}:f", c.max_in_flight))
        if c.tool_max_in_flight is not None:
            slots.append(SlotCounter(f"{counted}:f:{tool}", c.tool_max_in_flight))
        slot_id = f"{self._slot_prefix}:{next(self._slot_numbers)}" if slots else ""
        tallied = None
        if budgets or slots or tallies:
            try:
                decision = await self._store.admit(budgets, slots, slot_id, now, tallies)
            except CountersUnavailable:
                return refusal.counters_unavailable()
            if decision.refused is not None:
                kind, i = decision.refused
                if kind == "tally":  # nothing taken: the tripwires say why
                    return Ticket(self._store, (), "", c.deadline_s, Tallies(decision.tallied, i))
                if kind == "budget":
                    if self._please_try_again:
                        return refusal.please_try_again()
                    b = budgets[i]
                    if run is not None and b.key == f"{counted}:r:{run}":
                        return refusal.run_steps_exhausted(run, b.limit)
                    return refusal.budget_exhausted(
                        identity.agent, b.limit, ends, tool if b.key != f"{counted}:b" else None
                    )
                return refusal.too_many_in_flight(identity.agent, slots[i].limit)
            if tallies:
                tallied = Tallies(decision.tallied)
        return Ticket(self._store, tuple(slots), slot_id, c.deadline_s, tallied)


def _int(v: float | int | None) -> int | None:
    return None if v is None else int(v)
