"""The control plane's own view of the stops: a ``StopSet`` kept current by reading the registry.

The lease desk, the broker and the intents check decide against it (not against the watch):
``catch_up`` before every decision costs one ``MAX(revision)`` query when nothing changed.
"""

from __future__ import annotations

import anyio

from haltwire.stops import StopSet
from haltwire.store.registry import Registry

_PAGE = 1000


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
