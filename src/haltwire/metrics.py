"""Prometheus metrics: what every process's ``/metrics`` shares, and the gateway's own.

Each app has its own ``CollectorRegistry`` (never the global one), so several gateways or control
planes in one process (the tests, ``haltwire demo``) count apart. Label sets are bounded: no run
ids or identities; a tool or model no config names is labelled ``unknown``; a refusal code outside
the closed set of ``haltwire.refusal`` is ``other``. On the per-call path the labelled children
are bound once and kept, so a call costs a dict lookup and an increment per metric.

Nothing here serves HTTP: each process answers ``exposition(registry)`` on its own listener.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Final, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from haltwire.refusal import DEMO_CODES, REQUEST_CODES, TERMINAL_CODES, TRANSIENT_CODES, Refusal
from haltwire.scope import KINDS, Scope
from haltwire.stops import StopRecord, StopSet

#: The ``Content-Type`` of ``exposition``'s answer (Prometheus text format 0.0.4).
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
#: The label of a tool or model no config names.
UNKNOWN: Final = "unknown"
#: The label of a refusal code outside the closed set.
OTHER: Final = "other"
CODES: Final = TERMINAL_CODES | TRANSIENT_CODES | REQUEST_CODES | DEMO_CODES
#: Seconds: from a fast in-memory decision to an upstream's slow answer.
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Seconds from a stop's issue to its application.
PROPAGATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: A tool or model call's outcome as counted: answered, answered with an error, refused, or the
#: caller went away first.
OUTCOMES: Final = ("ok", "error", "refused", "cancelled")
#: The refusal codes about a lease, counted as the gateway's lease refusals.
LEASE_CODES: Final = frozenset({"lease_expired", "lease_invalid"})


class Watched(Protocol):
    """What the metrics read of a stop watch (``haltwire.watch.StopWatch``; no HTTP client imported here)."""

    stops: StopSet
    last_heard: float | None
    ready: bool
    on_stop: list[Callable[[StopRecord], None]]

    def clock(self) -> float: ...

    def monotonic(self) -> float: ...

    def current(self) -> bool: ...


def registry() -> CollectorRegistry:
    """A registry of an app's own (``auto_describe``: a collector's families are named at once)."""
    return CollectorRegistry(auto_describe=True)


def exposition(of: CollectorRegistry) -> bytes:
    """``of`` in the Prometheus text format, served with ``CONTENT_TYPE``."""
    return generate_latest(of)


def code_label(code: str) -> str:
    return code if code in CODES else OTHER


def outcome_of(result: object) -> str:
    """How a call ended, as counted: ``result`` is the tool result (a dict), a ``Refusal``, or None
    when the caller went away first."""
    if result is None:
        return "cancelled"
    if isinstance(result, Refusal):
        return "refused"
    return "error" if isinstance(result, dict) and result.get("isError") else "ok"


class Refusals:
    """``{prefix}_refusals_total{code, retryable}``, its children bound as codes are first seen."""

    def __init__(self, prefix: str, of: CollectorRegistry, what: str = "Refusals answered") -> None:
        self._counter = Counter(f"{prefix}_refusals_total", what, ["code", "retryable"], registry=of)
        self._bound: dict[tuple[str, bool], Callable[[], None]] = {}

    def count(self, code: str, retryable: bool) -> None:
        inc = self._bound.get((code, retryable))
        if inc is None:
            child = self._counter.labels(code_label(code), "true" if retryable else "false")
            inc = self._bound[(code, retryable)] = child.inc
            if code not in CODES:
                del self._bound[(code, retryable)]  # an unknown code is not kept (bounded)
        inc()


class Named:
    """A counter labelled ``(name, outcome)`` where only the names ``known`` says are configured
    get their own label (the rest share ``unknown``); children of known names are kept bound."""

    def __init__(self, counter: Counter, known: Callable[[str], bool]) -> None:
        self._counter = counter
        self._known = known
        self._bound: dict[tuple[str, str], Callable[[], None]] = {}

    def count(self, name: str, outcome: str) -> None:
        inc = self._bound.get((name, outcome))
        if inc is None:
            if not self._known(name):
                self._counter.labels(UNKNOWN, outcome).inc()
                return  # never kept: an agent's made-up names must not grow this dict
            inc = self._bound[(name, outcome)] = self._counter.labels(name, outcome).inc
        inc()


class WatchCollector(Collector):
    """What a stop watch holds, read at scrape time: active stops by scope kind, how long since it
    was last current, and whether it is now (the gateway fails closed while it is not)."""

    def __init__(self, prefix: str, watch: Watched) -> None:
        self._prefix = prefix
        self._watch = watch

    def describe(self) -> list[Metric]:
        return list(self._families({kind: 0 for kind in KINDS}, 0.0, False))

    def collect(self) -> Iterator[Metric]:
        watch = self._watch
        counts = {kind: 0 for kind in KINDS}
        for scope in watch.stops.active(watch.clock()):
            counts[Scope.parse(scope).kind] += 1
        heard = watch.last_heard
        staleness = float("inf") if heard is None else max(0.0, watch.monotonic() - heard)
        yield from self._families(counts, staleness, watch.current())

    def _families(self, counts: dict[str, int], staleness: float, current: bool) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            f"{self._prefix}_active_stops", "Active stops held, by scope kind", labels=["kind"]
        )
        for kind, n in counts.items():
            active.add_metric([kind], n)
        yield active
        yield GaugeMetricFamily(
            f"{self._prefix}_watch_staleness_seconds",
            "Seconds since the stop watch last heard the control plane (+Inf before it ever has)",
            value=staleness,
        )
        yield GaugeMetricFamily(
            f"{self._prefix}_watch_current",
            "1 while the stops held are current, 0 while failing closed",
            value=1.0 if current else 0.0,
        )


class GatewayMetrics:
    """The gateway's metrics (``docs/metrics.md``). ``tools`` says which tool names are configured
    (a model call is counted under its route's name, or ``unknown``); ``watch`` (with
    ``[control]``) adds the watch's metrics and stop propagation."""

    def __init__(self, tools: Callable[[str], bool], watch: Watched | None = None) -> None:
        p = "haltwire_gateway"
        self.registry = of = registry()
        self.tool_calls = Named(
            Counter(f"{p}_tool_calls_total", "Tool calls by tool and outcome", ["tool", "outcome"], registry=of),
            tools,
        )
        self.model_calls = Named(
            Counter(f"{p}_model_calls_total", "Model calls by model and outcome", ["model", "outcome"], registry=of),
            lambda name: True,
        )
        self.refusals = Refusals(p, of)
        duration = Histogram(
            f"{p}_call_duration_seconds",
            "A call's time at the gateway, by kind (tool or model)",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=of,
        )
        self.tool_duration = duration.labels("tool").observe
        self.model_duration = duration.labels("model").observe
        self._upstream = Histogram(
            f"{p}_upstream_duration_seconds",
            "A tool call's time at its upstream, by upstream",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=of,
        )
        self._upstreams: dict[str, Callable[[float], None]] = {}
        leases = Counter(f"{p}_leases_total", "Lease tokens seen, by result", ["result"], registry=of)
        self.lease_accepted = leases.labels("accepted").inc
        self.lease_refused = leases.labels("refused").inc
        #: Calls between the edge and their answer now (read at scrape time).
        self.in_flight = 0
        Gauge(f"{p}_calls_in_flight", "Tool and model calls in flight", registry=of).set_function(
            lambda: self.in_flight
        )
        if watch is not None:
            of.register(WatchCollector(p, watch))
            self._propagation = Histogram(
                f"{p}_stop_propagation_seconds",
                "From a stop's issue (the control plane's clock) to this gateway applying it",
                buckets=PROPAGATION_BUCKETS,
                registry=of,
            ).observe
            self._watch = watch
            watch.on_stop.append(self._stop_applied)

    def _stop_applied(self, stop: StopRecord) -> None:
        # The replay at start-up is history, not propagation.
        if self._watch.ready:
            self._propagation(max(0.0, self._watch.clock() - stop.issued_at))

    def upstream_duration(self, upstream: str, seconds: float) -> None:
        observe = self._upstreams.get(upstream)
        if observe is None:  # upstream names come from the config: bounded
            observe = self._upstreams[upstream] = self._upstream.labels(upstream).observe
        observe(seconds)

    def refused(self, r: Refusal) -> None:
        self.refusals.count(r.code, r.retryable)
        if r.code in LEASE_CODES:
            self.lease_refused()


class ExecutorMetrics:
    """The executor's (``[executor] metrics_port``): intents by what became of them, and the time
    of each intent's call to its upstream."""

    def __init__(self) -> None:
        p = "haltwire_executor"
        self.registry = of = registry()
        intents = Counter(f"{p}_intents_total", "Intents claimed, and settled by state", ["state"], registry=of)
        self._intents = {
            state: intents.labels(state).inc for state in ("claimed", "committed", "failed", "cancelled")
        }
        self.call_duration = Histogram(
            f"{p}_call_duration_seconds",
            "An intent's call to its upstream (each attempt)",
            buckets=LATENCY_BUCKETS,
            registry=of,
        ).observe

    def intent(self, state: str) -> None:
        """Count an intent ``claimed``, or settled ``committed``, ``failed`` or ``cancelled``."""
        inc = self._intents.get(state)
        if inc is not None:
            inc()


class EgressMetrics:
    """The egress proxy's: connections by outcome, refusals by code, tunnels open now."""

    def __init__(self) -> None:
        p = "haltwire_egress"
        self.registry = of = registry()
        connections = Counter(
            f"{p}_connections_total", "Proxy requests by outcome", ["outcome"], registry=of
        )
        self.relayed = connections.labels("relayed").inc
        self.refused_connection = connections.labels("refused").inc
        self.refusals = Refusals(p, of)
        #: CONNECT tunnels open now (read at scrape time).
        self.tunnels = 0
        Gauge(f"{p}_open_tunnels", "CONNECT tunnels open", registry=of).set_function(lambda: self.tunnels)

    def refused(self, r: Refusal) -> None:
        self.refused_connection()
        self.refusals.count(r.code, r.retryable)


def elapsed(since: float) -> float:
    return time.perf_counter() - since
