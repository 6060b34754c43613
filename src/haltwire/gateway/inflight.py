"""The calls in flight at the gateway, and what a new stop does to each (issue 12, point 2).

Every call the gateway forwards to an upstream is registered here while it runs (``start`` to
``end``). As the watch applies a new stop (``StopWatch.on_stop``, in the watch's own task),
each registered call is judged by the rule that judged it before it started
(``gateway.stops.verdict_refusal``: its scopes and its lease's generation). A call the stop
matches is handled by its tool's label:

- ``cancellable``: cut at once. Its cancel scope is cancelled, which aborts the upstream
  request (the upstream sees the call cancelled: its HTTP request closed on the modern path, a
  ``notifications/cancelled`` from the SDK client on stdio and handshake-era upstreams), and
  the agent is answered the ``stopped`` refusal instead of a result.
- ``bounded``: let finish under its own deadline. Cutting it would do no further harm, but
  neither would finishing, and its idempotency key then records a known outcome; the agent
  gets that outcome.
- ``irreversible``: never cut mid-call (its effect may be half made); it finishes under its
  deadline as a bounded one does (with intents on, such calls are intents and never in flight
  here: the control plane cancels those itself).

Once the call has ended, its outcome is queued for the control plane (``CallReports``), so the
run report says which calls were cut and which were let finish, and how they ended. The cut
never waits on that: it happens as the stop is applied. A call in no run (an identity with
``lease = "optional"``) is handled the same way, but has no run report: its outcome is logged.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from haltwire.config import Label
from haltwire.gateway.outcomes import CallReports, Outcome
from haltwire.gateway.stops import verdict_refusal
from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.stops import StopRecord
from haltwire.tokens import LeaseClaims
from haltwire.watch import StopWatch

log = logging.getLogger("haltwire.gateway")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(8)}"


@dataclass(eq=False)
class Call:
    """One call in flight. ``scope`` wraps its upstream request: cancelling it cuts the call."""

    identity: Identity
    tool: str
    label: Label
    lease: LeaseClaims | None
    started_at: float
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    call_id: str = field(default_factory=new_call_id)
    #: What a stop that reached the call in flight answers it, the stop, and when; None: none did.
    refusal: Refusal | None = None
    stop_id: str | None = None
    stopped_at: float | None = None
    #: A model call's model (``haltwire.gateway.model_calls``): ``tool`` is ``model:NAME``, which
    #: names it in the run report; ``model:`` stops reach it, ``tool:`` stops do not.
    model: str | None = None

    @property
    def scoped_tool(self) -> str | None:
        """The tool whose ``tool:`` stops reach this call (None for a model call)."""
        return None if self.model is not None else self.tool


class InFlight:
    def __init__(
        self, watch: StopWatch, reports: CallReports | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.watch = watch
        self.reports = reports
        self._clock = clock
        self._calls: set[Call] = set()
        watch.on_stop.append(self._stop_applied)

    def __len__(self) -> int:
        return len(self._calls)

    def start(
        self, identity: Identity, tool: str, label: Label, lease: LeaseClaims | None, *, model: str | None = None
    ) -> Call | Refusal:
        """Register a call about to reach its upstream, or the refusal of a stop applied since its
        own check (the ceilings' admission may have waited on Redis): then nothing reached it.
        ``model``: a model call's model (``tool`` is ``model:NAME``; ``model:`` stops reach it,
        no ``tool:`` stop does)."""
        stopped = verdict_refusal(self.watch, identity, None if model is not None else tool, lease, model)
        if stopped is not None:
            return stopped
        call = Call(identity, tool, label, lease, self._clock(), model=model)
        self._calls.add(call)  # no await since the check: no stop can fall in between
        return call

    def end(self, call: Call, outcome: Outcome) -> None:
        """The call has ended as ``outcome``: forget it, and report it if a stop reached it."""
        self._calls.discard(call)
        if call.stop_id is None or call.stopped_at is None:
            return
        ended_at = self._clock()
        record = {
            "call_id": call.call_id,
            "tool": call.tool,
            "label": call.label,
            "stop_id": call.stop_id,
            "outcome": outcome,
            "started_at": call.started_at,
            "stopped_at": call.stopped_at,
            "ended_at": max(ended_at, call.stopped_at),
        }
        log.info(
            "%s of %s (%s), reached in flight by stop %s: %s",
            call.call_id,
            call.tool,
            call.label,
            call.stop_id,
            outcome,
        )
        if call.lease is None:
            log.warning(
                "%s of %s was in no run: no run report records its outcome", call.call_id, call.identity.agent
            )
        elif self.reports is not None:
            self.reports.record(call.lease.run, record)

    def _stop_applied(self, stop: StopRecord) -> None:
        now = self._clock()
        for call in list(self._calls):
            if call.stop_id is not None:
                continue  # an earlier stop reached it already
            refusal = verdict_refusal(self.watch, call.identity, call.scoped_tool, call.lease, call.model)
            if refusal is None:
                continue
            call.refusal, call.stopped_at = refusal, now
            # ``stopped`` names the stop; a fence (``lease_invalid``) is this new stop's doing.
            call.stop_id = str(dict(refusal.extra).get("stop_id", stop.stop_id))
            if call.label == "cancellable":
                call.scope.cancel()  # the call's own task unwinds; the upstream sees it cancelled
