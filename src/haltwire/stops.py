"""Stop records, the stops one process knows of, and the one answer to "is this stopped?".

A stop record has a scope, a reason, who issued it and when, an optional expiry, and the
registry revision it was written at; a later ``clear`` change says who cleared it and why.
``StopSet`` holds the stops one process follows (the gateway and credential verifiers from
the watch stream, the control plane from its own registry).

``StopSet.verdict`` is the stop rule, written once: every enforcement point (the gateway, the
lease desk, the broker, the executor's final check, the downstream credential verifier) asks
it and only maps its answer to its own wire type. For a set of scopes and, for a lease or a
credential, the registry revision its grant was checked at (its generation), it answers:

1. ``Stopped``: the broadest active stop on one of the scopes (global, tenant, version, agent,
   tool or model, run), so the refusal names the stop an operator is most likely to clear last;
2. ``Fenced``: no active stop, but a stop issued after the grant on a scope that can end a run
   (never a tool or model scope: such a stop refuses calls to the tool or model, it ends no
   run), cleared or not,
   so a grant from before a stop stays refused after the stop is cleared;
3. None: go ahead. With no active stop and nothing issued since the grant this costs two
   comparisons, and the scopes are not even built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from haltwire.limits import MAX_REASON_CHARS, has_control_characters
from haltwire.scope import Scope, ScopeIndex

ChangeKind = Literal["stop", "clear"]
#: What became of a tool call that a stop found in flight at the gateway, as the run report says:
#: ``cancelled`` (cut by the stop), ``abandoned`` (cut by its caller going away), else how the
#: call ended once let finish.
CallOutcome = Literal[
    "cancelled", "completed", "failed", "deadline_exceeded", "upstream_unavailable", "abandoned"
]


def checked_reason(reason: str, what: str = "a stop") -> str:
    """``reason`` if it is a reason: not blank, bounded, no control characters but newline and tab."""
    if not reason.strip():
        raise ValueError(f"{what} needs a reason")
    if len(reason) > MAX_REASON_CHARS:
        raise ValueError(f"a reason is at most {MAX_REASON_CHARS} characters, not {len(reason)}")
    if has_control_characters(reason, allowed="\n\t"):
        raise ValueError("a reason may not hold control characters (newline and tab are fine)")
    return reason


@dataclass(frozen=True, slots=True)
class StopRecord:
    stop_id: str
    scope: str
    reason: str
    issued_by: str
    issued_at: float
    expires_at: float | None
    revision: int
    cleared_by: str | None = None
    cleared_at: float | None = None
    clear_reason: str | None = None
    cleared_revision: int | None = None

    @property
    def cleared(self) -> bool:
        return self.cleared_revision is not None

    def active_at(self, now: float) -> bool:
        return not self.cleared and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the history; ``stop`` is the stop as of this change."""

    revision: int
    kind: ChangeKind
    stop: StopRecord


@dataclass(frozen=True, slots=True)
class Stopped:
    """An active stop covers the scopes: the broadest one, and the scope it names."""

    scope: Scope
    stop: StopRecord


@dataclass(frozen=True, slots=True)
class Fenced:
    """A stop on the run's scopes was issued (at ``revision``) after the grant (``generation``)."""

    revision: int
    generation: int


Verdict = Stopped | Fenced


class StopSet:
    def __init__(self) -> None:
        self._index: ScopeIndex[dict[str, StopRecord]] = ScopeIndex()
        self._fences: dict[Scope, int] = {}
        #: The revision of the last change applied.
        self.revision = 0

    def apply(self, kind: ChangeKind, stop: StopRecord, revision: int) -> None:
        """Apply one change of the registry's history (in revision order)."""
        scope = Scope.parse(stop.scope)
        if kind == "stop":
            self._fences[scope] = max(self._fences.get(scope, 0), stop.revision)
        hit = self._index.match(frozenset({scope}))
        stops = hit[1] if hit is not None else {}
        if kind == "stop" and not stop.cleared:
            stops[stop.stop_id] = stop
            self._index.add(scope, stops)
        else:
            stops.pop(stop.stop_id, None)
            if not stops:
                self._index.remove(scope)
        self.revision = max(self.revision, revision)

    def verdict(
        self,
        scopes: frozenset[Scope] | Callable[[], frozenset[Scope]],
        now: float,
        generation: int | None = None,
    ) -> Verdict | None:
        """Whether work in ``scopes`` (a set, or a function building it) is stopped at ``now``,
        for a grant checked at ``generation`` when given. See the module's docstring."""
        if not self._index and (generation is None or generation >= self.revision):
            return None  # no active stop, and nothing issued since the grant (fences <= revision)
        wanted = scopes() if callable(scopes) else scopes
        hit = self.match(wanted, now)
        if hit is not None:
            return Stopped(*hit)
        if generation is not None:
            fence = self.fence(frozenset(s for s in wanted if s.kind not in ("tool", "model")))
            if fence > generation:
                return Fenced(fence, generation)
        return None

    def match(self, scopes: frozenset[Scope], now: float) -> tuple[Scope, StopRecord] | None:
        """The broadest active stop covering any of ``scopes`` at ``now``, or None."""
        if not len(self._index):
            return None
        while (hit := self._index.match(scopes)) is not None:
            scope, stops = hit
            for stop in stops.values():
                if stop.active_at(now):
                    return scope, stop
            # Every stop on this scope has expired: forget them and look at the next scope.
            self._index.remove(scope)
        return None

    def fence(self, scopes: frozenset[Scope]) -> int:
        """The revision of the newest stop ever issued on one of ``scopes``; 0 if none."""
        if not self._fences:
            return 0
        return max((self._fences.get(s, 0) for s in scopes), default=0)

    def active(self, now: float) -> list[str]:
        """The scope of each stop active at ``now`` (for metrics; not on a call's path)."""
        return [s.scope for stops in self._index.values() for s in stops.values() if s.active_at(now)]

    def __len__(self) -> int:
        """How many scopes have an active (possibly expired, not yet noticed) stop."""
        return len(self._index)
