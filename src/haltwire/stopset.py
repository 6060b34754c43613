"""The stops one process knows of, kept current from the registry's changes.

Both enforcement points that must answer "is this stopped?" without a round trip use it:
the gateway (from its watch stream) and the control plane's lease grants (from its own
registry). ``match`` is a set lookup per call. ``fence`` is the fencing bound for lease
tokens: the revision of the newest stop ever issued on any of the scopes, cleared or not,
so a lease granted before a stop stays refused after the stop is cleared.
"""

from __future__ import annotations

import anyio

from haltwire.scope import Scope, ScopeIndex
from haltwire.store.registry import ChangeKind, Registry, StopRecord

_PAGE = 1000


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

    def __len__(self) -> int:
        """How many scopes have an active (possibly expired, not yet noticed) stop."""
        return len(self._index)


class StopMirror:
    """A ``StopSet`` kept current by reading the registry itself (the control plane's own
    decisions: lease grants, credentials), not by following the watch."""

    def __init__(self) -> None:
        self.stops = StopSet()
        self._lock = anyio.Lock()

    async def catch_up(self, registry: Registry) -> None:
        """Apply the registry's changes past the mirror's revision, if there are any: one
        ``MAX(revision)`` query when nothing changed, so it can run before every decision and
        a stop acknowledged by any replica counts at once on every replica."""
        if await registry.revision() <= self.stops.revision:
            return
        async with self._lock:  # one request applies the changes; the others then find none new
            while True:
                changes = await registry.changes_since(self.stops.revision, limit=_PAGE)
                for change in changes:
                    self.stops.apply(change.kind, change.stop, change.revision)
                if len(changes) < _PAGE:
                    return
