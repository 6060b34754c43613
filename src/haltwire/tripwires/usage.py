"""The usage kinds of the per-call tripwires: ``tokens`` and ``model_cost`` on model calls.

A model call's tokens are known only once it has ended, so such a budget is kept in two places
(``engine.Tripwires.plan`` and ``engine.Tripwires.spent``):

- at admission, a check of the run's count so far (a ``Tally`` of 0 with ``limit - 1``: it
  writes nothing, and refuses once the count has reached ``limit``), in the same atomic admission
  as the ceilings' counters; an enforced rule refuses the call ``tripwire_tripped`` and trips;
- when the call ends (its whole answer's ``usage``, its stream's usage event, or for a stream
  cut before that event, what was relayed), its usage is added (one ``tally`` for every usage
  rule); the call whose usage brings the count from under ``limit`` to ``limit`` or past it trips
  the rule: in enforce mode its scope is latched and stopped, in shadow mode the would-be firing
  is recorded. The call itself was served.

The overshoot is bounded: calls admitted before the trip may still be in flight, and each adds
its usage when it ends; none admitted after it is served (this gateway's latch, then the stop,
refuse them; other gateways on the same Redis counters read the count at admission). So a run
ends at most ``limit - 1`` plus the usage of the call that crossed it plus that of the calls in
flight with it. Shadow rules check nothing at admission: they cost a model call nothing until it
ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from haltwire.tripwires.rules import ANY_MODEL, MODEL_PREFIX, USAGE_KINDS, TripwireRule


@dataclass(frozen=True, slots=True)
class Spent:
    """What one model call used: input and output tokens, and their cost in millionths of the
    price's unit (``[[models]] prices``; 0 without a price)."""

    input: int
    output: int
    money_micros: int = 0


def amount_of(rule: TripwireRule, spent: Spent) -> int:
    """What ``spent`` adds to ``rule``'s count."""
    if rule.kind == "model_cost":
        return spent.money_micros
    which = rule.count or "total"
    if which == "input":
        return spent.input
    if which == "output":
        return spent.output
    return spent.input + spent.output


def check_limit(rule: TripwireRule) -> int:
    """The limit of the admission check (``Tally(key, 0, check_limit)``): refused at ``limit``."""
    assert rule.limit is not None and rule.limit >= 1
    return rule.limit - 1


def crossed(rule: TripwireRule, value: int, amount: int) -> bool:
    """Whether the call that added ``amount`` (the count now ``value``) brought it to its limit."""
    assert rule.limit is not None
    return amount > 0 and value - amount < rule.limit <= value


def check_model_rules(rules: Sequence[TripwireRule], names: Iterable[str], priced: bool) -> None:
    """The gateway config's checks of rules on model calls (``ValueError``): ``names`` are the
    model calls' names ``[[models]]`` routes (``model:NAME``, ``model:PREFIX*``), ``priced``
    whether any entry has prices."""
    routed = set(names)
    for r in rules:
        named = [t for t in r.tools if t.startswith(MODEL_PREFIX)]
        if (r.kind in USAGE_KINDS or named) and not routed:
            raise ValueError(f"tripwires: {r.name} is a rule on model calls, and no [[models]] routes any")
        for t in named:
            if t != ANY_MODEL and t not in routed:
                raise ValueError(
                    f"tripwires: {r.name} names {t!r}, which no [[models]] entry routes (a model routed by a "
                    f"prefix is counted as model:PREFIX*; routed: {', '.join(sorted(routed))})"
                )
        if r.kind == "model_cost" and not priced:
            raise ValueError(f"tripwires: {r.name} counts the cost of model calls; give [[models]] prices")
