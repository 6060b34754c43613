"""The egress proxy's open connections, by run, and what closes them (state; no HTTP here).

Every tunnel and every forwarded request is registered here from the moment its target is
connected to until it is closed (``open`` to ``closed``), with its run's lease claims and a
cancel scope that wraps all of its I/O. Three things cancel that scope, and so close both of
its sockets at once (the client's stream ends, the target sees the close):

1. a stop: as the watch applies a new stop (``StopWatch.on_stop``, in the watch's own task,
   before it reads the next event), every open connection is judged by the rule that admitted
   it (``haltwire.leasecheck.run_verdict``: its run's scopes and its lease's generation); each
   one the stop reaches is cancelled;
2. its lease's expiry: the scope's deadline is the lease's ``expires_at`` by the proxy's clock
   (a renewed lease does not extend a connection opened with the old token: the client opens
   a new one with the new token);
3. a stale watch: ``cut_all``, called by the proxy's staleness guard once the watch has heard
   nothing for ``staleness_s`` (fail closed).

``closed`` logs each connection with its bytes both ways, its duration and what closed it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio

from haltwire.leasecheck import run_refusal, run_verdict
from haltwire.refusal import Refusal
from haltwire.stops import StopRecord
from haltwire.tokens import LeaseClaims
from haltwire.watch import StopWatch

log = logging.getLogger("haltwire.egress")

Kind = Literal["tunnel", "forward"]
#: Who the enforcement point is, in its ``registry_unreachable`` refusal.
POINT = "egress proxy"


@dataclass(eq=False)
class Connection:
    """One open tunnel or forwarded request. ``sent``: client to target; ``received``: back."""

    claims: LeaseClaims
    kind: Kind
    target: str
    started: float
    scope: anyio.CancelScope
    sent: int = 0
    received: int = 0
    #: What cut it (``stop stp_...``, ``stale watch``); None: it ended by itself or at its deadline.
    cut_by: str | None = None


class OpenConnections:
    def __init__(
        self,
        watch: StopWatch,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self._clock = clock
        self._monotonic = monotonic
        self._open: set[Connection] = set()
        watch.on_stop.append(self._stop_applied)

    def __len__(self) -> int:
        return len(self._open)

    def of_run(self, run: str) -> list[Connection]:
        return [c for c in self._open if c.claims.run == run]

    def open(self, claims: LeaseClaims, kind: Kind, target: str) -> Connection | Refusal:
        """Register a connection about to relay, or the refusal of a stop (or a stale watch) that
        came since its own check (its target's name was resolved in between). Call it in the
        task that will relay: its cancel scope's deadline is set from the event loop's clock."""
        refused = run_refusal(self.watch, claims, POINT)
        if refused is not None:
            return refused
        left = claims.expires_at - self._clock()
        scope = anyio.CancelScope(deadline=anyio.current_time() + max(0.0, left))
        conn = Connection(claims, kind, target, self._monotonic(), scope)
        self._open.add(conn)  # no await since the check: no stop can fall in between
        return conn

    def closed(self, conn: Connection) -> None:
        """``conn`` is closed: forget it, and log it."""
        self._open.discard(conn)
        if conn.cut_by is None and anyio.current_time() >= conn.scope.deadline:
            conn.cut_by = "lease expiry"
        took = self._monotonic() - conn.started
        how = f"cut by {conn.cut_by}" if conn.cut_by is not None else "ended"
        log.log(
            logging.WARNING if conn.cut_by is not None else logging.INFO,
            "%s of run %s to %s %s: %d bytes sent, %d received, %.3f s",
            conn.kind,
            conn.claims.run,
            conn.target,
            how,
            conn.sent,
            conn.received,
            took,
        )

    def cut_all(self, why: str) -> int:
        """Close every open connection (the watch is stale); answers how many."""
        cut = 0
        for conn in list(self._open):
            if conn.cut_by is None:
                conn.cut_by = why
                conn.scope.cancel()
                cut += 1
        return cut

    def _stop_applied(self, stop: StopRecord) -> None:
        for conn in list(self._open):
            if conn.cut_by is not None:
                continue
            if run_verdict(self.watch, conn.claims) is not None:
                conn.cut_by = f"stop {stop.stop_id}"
                conn.scope.cancel()  # its task unwinds and closes both sockets
