"""An admission split by owner, for Redis Cluster: which keys go in one script, and how to give back.

Every counter's key starts with its owner (``OWNER:...``), and the Redis store makes the owner a
hash tag, so one owner's keys share a cluster slot. The owners (``haltwire.identity``):

- an identity (``TENANT/AGENT@VERSION``, ``Identity.counted_as``): its budgets, slots and run
  steps, and every count per run (a run belongs to one identity: its lease is bound to it);
- a tenant (``TENANT/*``): a ``rate`` rule ``per = "tenant"``, a trip held on a tenant, the
  tenant's model usage;
- an agent across its tenants and versions (``*/AGENT``): a ``rate`` rule ``per = "agent"``, a
  trip held on an agent or on one of its versions.

On one Redis server an admission is one script whatever its owners. On a cluster it is one
script per owner it touches (``parts``), the identity's first: most calls touch their identity
only (one round trip). Each part checks and takes its own counters atomically; the call is
admitted once every part has. A part that refuses (or fails) ends the admission and the parts
taken before it are given back (``refund.lua``): no limit is ever passed, but for that round
trip the call held counts it gave back, and a concurrent call may be refused for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from haltwire.store.counters import BudgetCounter, Repeat, SlotCounter, Streak, TallyOp


def owner(key: str) -> str:
    """The owner of a counter's key: everything before its first colon."""
    return key.partition(":")[0]


@dataclass
class Part:
    """One owner's counters in an admission, by their index in the whole admission."""

    owner: str
    budgets: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    tallies: list[int] = field(default_factory=list)


def parts(
    budgets: Sequence[BudgetCounter], slots: Sequence[SlotCounter], tallies: Sequence[TallyOp]
) -> list[Part]:
    """The admission's parts, in the order they are taken: the owner of the budgets and slots
    (the identity) first, then the tallies' other owners in the order they first appear."""
    found: dict[str, Part] = {}

    def part(key: str) -> Part:
        o = owner(key)
        p = found.get(o)
        if p is None:
            p = found[o] = Part(o)
        return p

    for i, b in enumerate(budgets):
        part(b.key).budgets.append(i)
    for i, s in enumerate(slots):
        part(s.key).slots.append(i)
    for i, op in enumerate(tallies):
        part(op.key).tallies.append(i)
    return list(found.values())


def written(op: TallyOp, count: int) -> str:
    """What admit.lua wrote for a streak or a repeat whose count became ``count``."""
    return f"{op.digest}:{count}" if isinstance(op, Repeat) else str(count)


def count_before(op: TallyOp, count: int, raw: str) -> int:
    """The op's count before admit.lua applied it (``raw``: the key's value then, '' for none)."""
    if isinstance(op, Streak):
        return int(raw or 0)
    if isinstance(op, Repeat):
        return int(raw.rpartition(":")[2]) if raw else 0
    return count - op.amount


def refund_args(ops: Sequence[TallyOp], counts: Sequence[int], raws: Sequence[str]) -> list[Any]:
    """refund.lua's three arguments per tally op (see its contract)."""
    args: list[Any] = []
    for op, count, raw in zip(ops, counts, raws, strict=True):
        if isinstance(op, Streak | Repeat):
            args += ["s", written(op, count), raw]
        else:
            args += ["t", op.amount, ""]
    return args
