"""The control plane's metrics (``docs/metrics.md``), served on the admin listener's ``/metrics``.

What the registry, the intents and the audit log hold is read from the stores at scrape time
(``refresh``), so every replica and both of ``haltwire control``'s processes count the same
history: stops issued and cleared by scope kind, active stops by scope kind, intents by state,
audit records written. What happens in a process is counted as it happens: lease grants and
refusals by a stop (this process's lease desk's, plus the agents' process's, shared through
``lease_counts``) and tripwire firings recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from haltwire.control.lease_counts import SharedCounts
from haltwire.control.plane import Plane
from haltwire.intents import STATES
from haltwire.metrics import registry
from haltwire.scope import KINDS, Scope

P = "haltwire_control"


class Snapshot:
    """What the stores held at the last scrape."""

    def __init__(self) -> None:
        self.issued = dict.fromkeys(KINDS, 0)
        self.cleared = dict.fromkeys(KINDS, 0)
        self.active = dict.fromkeys(KINDS, 0)
        self.intents = dict.fromkeys(STATES, 0)
        self.audit_records = 0


class StoredCollector(Collector):
    def __init__(self, snapshot: Snapshot, plane: Plane) -> None:
        self.snapshot = snapshot
        self.plane = plane
        #: The agents' process's lease counts, when it is one of ours.
        self.peer: SharedCounts | None = None

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        for name, what, counts in (
            ("stops_issued", "Stops ever issued, by scope kind", s.issued),
            ("stops_cleared", "Stops ever cleared, by scope kind", s.cleared),
        ):
            family = CounterMetricFamily(f"{P}_{name}", what, labels=["kind"])
            for kind, n in counts.items():
                family.add_metric([kind], n)
            yield family
        active = GaugeMetricFamily(f"{P}_active_stops", "Active stops, by scope kind", labels=["kind"])
        for kind, n in s.active.items():
            active.add_metric([kind], n)
        yield active
        intents = GaugeMetricFamily(f"{P}_intents", "Intents, by state", labels=["state"])
        for state, n in s.intents.items():
            intents.add_metric([state], n)
        yield intents
        yield CounterMetricFamily(f"{P}_audit_records", "Audit records written", value=s.audit_records)
        desk = self.plane.leases
        granted, refused = (0, 0) if desk is None else (desk.granted, desk.refused)
        if self.peer is not None:  # the agents' process's desk (``lease_counts``)
            theirs = self.peer.read()
            granted, refused = granted + theirs[0], refused + theirs[1]
        leases = CounterMetricFamily(f"{P}_leases", "Lease grants and refusals by a stop", labels=["result"])
        leases.add_metric(["granted"], granted)
        leases.add_metric(["refused"], refused)
        yield leases


class ControlMetrics:
    """One per ``Plane`` (its app's state): the snapshot ``refresh`` reads, and the firings counted."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.registry = of = registry()
        self.snapshot = Snapshot()
        self.collector = StoredCollector(self.snapshot, plane)
        of.register(self.collector)
        self.tripwire_firings = Counter(
            f"{P}_tripwire_firings_total", "Shadow tripwire firings recorded", registry=of
        ).inc

    async def refresh(self) -> None:
        """Read the stores into the snapshot (three reads and the mirror's catch-up)."""
        plane = self.plane
        stores = plane.open
        issued = dict.fromkeys(KINDS, 0)
        cleared = dict.fromkeys(KINDS, 0)
        for stop in await stores.registry.all_stops():
            kind = Scope.parse(stop.scope).kind
            issued[kind] += 1
            if stop.cleared:
                cleared[kind] += 1
        active = dict.fromkeys(KINDS, 0)
        mirror = await plane.catch_up()
        for scope in mirror.stops.active(time.time()):
            active[Scope.parse(scope).kind] += 1
        intents = dict.fromkeys(STATES, 0)
        intents.update(await stores.intents.count_by_state())
        s = self.snapshot
        s.issued, s.cleared, s.active, s.intents = issued, cleared, active, intents
        s.audit_records = (await stores.audit.head()).seq
