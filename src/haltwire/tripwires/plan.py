"""What the per-call tripwires (``haltwire.tripwires.engine``) keep per call and per scope: a
call's plan of admission counts, a latched scope, and the bounds of what is kept."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Final

from haltwire.identity import Identity
from haltwire.store.counters import TallyOp
from haltwire.tripwires.rules import TripwireRule, digest
from haltwire.tripwires.writer import Trip

#: How long a run's counts are kept after its last call (as the ceilings' run budget).
RUN_TTL_S: Final = 7 * 24 * 3600.0
#: Calls kept as evidence per count, and counts with evidence kept (the oldest go first).
EVIDENCE_CALLS: Final = 10
EVIDENCE_KEYS: Final = 10_000
#: Scopes latched at once; past it the oldest latch goes (its stop was long written).
MAX_LATCHED: Final = 100_000
#: Trips and would-be firings kept for inspection (tests, the log's neighbours).
KEPT: Final = 1000


@dataclass
class Plan:
    """One call's counts in the admission rules, and which rule each is for."""

    identity: Identity
    tool: str
    run: str | None
    arguments: dict[str, Any] | None
    now: float
    ops: list[TallyOp] = field(default_factory=list)
    #: Per op: its rule, the tag of a rate's window (part of its trip's key), the amount counted.
    owners: list[tuple[TripwireRule, str, int]] = field(default_factory=list)

    @functools.cached_property
    def args_digest(self) -> str:
        """The digest of the call (its tool and normalized arguments), computed once."""
        return digest([self.tool, self.arguments or {}])

    def add(self, op: TallyOp, rule: TripwireRule, tag: str, amount: int) -> None:
        self.ops.append(op)
        self.owners.append((rule, tag, amount))


@dataclass(slots=True)
class Latch:
    """A scope this gateway tripped, refused until its stop has reached it through the watch."""

    trip: Trip
    #: The revision of its stop once written; the latch goes once the watch has reached it.
    landed_at: int | None = None
