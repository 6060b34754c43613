"""The enforcement pipeline for one ``tools/call``: the kill switch, the lease, the stops, the
tripwires' latch, the ceilings, the tripwires' admission, the idempotency key (bounded tools), the
upstream, the tripwires' judgement of the outcome.

Order matters and is fixed: a suspended identity, a bad lease or a stopped call is refused
before anything is counted; a lease names the call's run, so run stops, the lease's fencing
generation and the run's step budget apply to it;
an admitted call holds its slots until the upstream answers, fails, times out or is
cancelled (the ``finally`` below); the upstream call runs under the tool's deadline (the
smaller of its limits' and its label's), so a hung upstream cannot hold a slot. A call to a
bounded tool is made at most once per idempotency key (``haltwire.gateway.idempotency``),
checked after admission so that a refused call consumes no key. A call to an irreversible tool
never reaches the upstream: after admission it is recorded as an intent for the executor
(``haltwire.gateway.intents``). The gateway's own ``haltwire_intent`` tool takes the same
pipeline (kill switch, lease, stops, ceilings), then is answered here, not upstream.

The steps before routing (the kill switch, the lease, the stops, the tripwires' latch) are
``Gateway.screen``, and admission (the tripwires' counts with the ceilings', then their
judgement) is ``Gateway.admit``: a model call (``haltwire.gateway.model_calls``) takes both, as a
call to ``model:NAME`` (no ``tool:`` stop reaches it), and its outcome is judged by the same
``Tripwires.settle``; its tokens by ``Tripwires.spent``.

A stop also reaches calls already past its check: just before a call reaches its upstream it is
registered as in flight (``haltwire.gateway.inflight``), after one more look at the stops
(admission may have waited on Redis), and a stop applied while it runs cuts it if its tool is
cancellable (the agent gets ``stopped``) or lets it finish under its deadline if bounded or
irreversible; either way its outcome goes to the control plane for the run report.

Per-call tripwires (``haltwire.tripwires.engine``, with ``[[tripwires]]``) take three places:
after the stop check, a scope this gateway tripped is refused ``tripwire_tripped`` until the
stop it wrote arrives through the watch; the budget rules (steps, money, rate) and repeated
calls are counted in the ceilings' own atomic admission (one round trip for every counter, all
or nothing: a call that either refuses counts nowhere), and the call that would go past a limit is
refused there, never served; once the result
or refusal is known (any after the stop check: a ceiling's refusal is a policy hit), policy
hits, repeated results and content signals judge it (a JSON-RPC error from the upstream, or an
unknown tool, as an error result), and a content signal replaces the result. A tripwire's own
refusal is not judged again.

With ``[call_log]`` (``haltwire.tripwires.calllog``), each call (a model call too, as
``model:NAME`` with its usage) is recorded once its outcome is known: how far it got (refused
before the tripwires, before routing, at admission, or admitted), its outcome before the
tripwires' judgement of it, and what fired; the record is appended to a buffer that a task of
the gateway's writes out.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from haltwire import refusal
from haltwire.gateway.ceilings import Ceilings, Ticket
from haltwire.gateway.idempotency import Idempotency
from haltwire.gateway.inflight import InFlight
from haltwire.gateway.intents import INTENT_TOOL, IntentDesk
from haltwire.gateway.killswitch import SuspensionFile
from haltwire.gateway.leases import LeaseCheck, without_lease
from haltwire.gateway.outcomes import Outcome
from haltwire.gateway.stops import stop_refusal
from haltwire.identity import Identity
from haltwire.logs import log_refusal
from haltwire.meta import LEASE_META
from haltwire.metrics import GatewayMetrics, outcome_of
from haltwire.refusal import Refusal
from haltwire.store.counters import CountersUnavailable
from haltwire.tokens import LeaseClaims
from haltwire.tripwires.calllog import CURRENT, CallLog, reached
from haltwire.tripwires.engine import Tripwires
from haltwire.upstreams import Progress, Route, Upstreams, UpstreamUnavailable
from haltwire.watch import StopWatch

if TYPE_CHECKING:
    from haltwire.gateway.tracing import CallTracer

log = logging.getLogger("haltwire.gateway")

#: What the tripwires judge a call that ended in a JSON-RPC error by: an error result.
FAILED: dict[str, Any] = {"isError": True, "content": []}

#: How long releasing a slot may take once the call is over (shielded from cancellation).
RELEASE_TIMEOUT_S = 2.0


async def released(ticket: Ticket, identity: Identity) -> None:
    """Give back an admitted call's slots, shielded: a cancelled call (client gone) must still
    give them back; a store that cannot now is logged (the slots expire by themselves). A store
    whose release never waits (``releases_at_once``: in memory) is not cut by a cancellation
    anyway, and is spared the shield's timer on every call."""
    if ticket.store.releases_at_once:
        await ticket.release()
        return
    with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
        try:
            await ticket.release()
        except CountersUnavailable as exc:
            log.warning("could not release a slot of %s (%s); it expires by itself", identity.agent, exc)


class UnknownTool(MCPError):
    def __init__(self, name: str) -> None:
        super().__init__(INVALID_PARAMS, f"Unknown tool: {name}")


class Gateway:
    def __init__(
        self,
        upstreams: Upstreams,
        ceilings: Ceilings,
        suspensions: SuspensionFile,
        stops: StopWatch | None = None,
        leases: LeaseCheck | None = None,
        idempotency: Idempotency | None = None,
        intents: IntentDesk | None = None,
        inflight: InFlight | None = None,
        tripwires: Tripwires | None = None,
        call_log: CallLog | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.upstreams = upstreams
        #: What ``/metrics`` answers; by default, tools any upstream offers get their own label.
        self.metrics = metrics if metrics is not None else GatewayMetrics(self.known_tool, watch=stops)
        #: Spans for tool calls (``[tracing]``); None: no tracing module is even imported.
        self.tracer: CallTracer | None = None
        #: Where each call is recorded (``[call_log]``); None: nothing is.
        self.call_log = call_log
        #: Per-call tripwire rules; None (no rule on): no tripwire work per call.
        self.tripwires = tripwires
        #: Calls in flight, for new stops to reach (with ``[control]``); None: no stop reaches them.
        self.inflight = inflight
        #: Irreversible calls become intents; None: they are forwarded like any other.
        self.intents = intents
        #: Idempotency keys for bounded tools; None: every call is forwarded as it comes.
        self.idempotency = idempotency
        self.ceilings = ceilings
        self.suspensions = suspensions
        self.stops = stops
        self.leases = leases
        self._catalogue: tuple[list[types.Tool], list[types.Tool]] | None = None

    @property
    def tools(self) -> list[types.Tool]:
        """The catalogue for ``tools/list`` (``IntentDesk.catalogue`` when irreversible calls are intents)."""
        listed = self.upstreams.tools
        if self.intents is None:
            return listed
        cached = self._catalogue
        if cached is None or cached[0] is not listed:  # rebuilt only when the upstreams' list is
            cached = self._catalogue = (listed, self.intents.catalogue(listed, self.upstreams.label))
        return cached[1]

    def known_tool(self, name: str) -> bool:
        """Whether ``name`` is a tool this gateway serves (its metrics label others ``unknown``)."""
        return self.upstreams.route(name) is not None or self._status_tool(name) is not None

    def _status_tool(self, name: str) -> IntentDesk | None:
        intents = self.intents
        return intents if name == INTENT_TOOL and intents is not None else None

    async def call_tool(
        self,
        identity: Identity,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None = None,
        progress: Progress | None = None,
        lease_header: str | None = None,
        credential: LeaseClaims | None = None,
        request: tuple[str | int | None, str | None] = (None, None),
    ) -> dict[str, Any] | Refusal:
        """The upstream's result in wire form, or the refusal that replaces it.

        ``request`` is the JSON-RPC request id and the MCP session id (when there is one), for the
        call's span.

        ``lease_header`` is the ``Haltwire-Lease`` header, used when ``meta`` carries no token.
        ``credential`` is a broker credential the edge verified as the bearer token: it stands
        for the lease (its run is the call's run), and any lease token is then ignored.
        Raises ``UnknownTool`` (a JSON-RPC error) for a name no upstream offers.
        """
        calls = self.call_log
        if calls is None:
            return await self._observed(identity, name, arguments, meta, progress, lease_header, credential, request)
        entry = calls.begin(identity, name, arguments, self.upstreams.label(name))
        token = CURRENT.set(entry)
        result: dict[str, Any] | Refusal | None = None
        outcome = "cancelled"
        try:
            result = await self._observed(
                identity, name, arguments, meta, progress, lease_header, credential, request
            )
            return result
        except MCPError:
            result = FAILED
            raise
        finally:
            CURRENT.reset(token)
            calls.end(entry, result, outcome)

    async def _observed(
        self,
        identity: Identity,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
        lease_header: str | None,
        credential: LeaseClaims | None,
        request: tuple[str | int | None, str | None],
    ) -> dict[str, Any] | Refusal:
        """The call, counted (``haltwire.metrics``), its refusal logged, and traced when on."""
        metrics = self.metrics
        tracer = self.tracer
        span = None if tracer is None else tracer.start(name, meta, *request)
        started = time.perf_counter()
        metrics.in_flight += 1
        seen: list[LeaseClaims | None] = []
        result: dict[str, Any] | Refusal | None = None
        error = None
        try:
            result = await self._call(identity, name, arguments, meta, progress, lease_header, credential, seen)
            return result
        except MCPError as exc:
            result, error = FAILED, str(exc.code)
            raise
        finally:
            metrics.in_flight -= 1
            metrics.tool_duration(time.perf_counter() - started)
            metrics.tool_calls.count(name, outcome_of(result))
            lease = seen[0] if seen else None
            if lease is not None:
                metrics.lease_accepted()
            if isinstance(result, Refusal):
                metrics.refused(result)
                log_refusal(log, identity, name, lease.run if lease is not None else None, result)
            if span is not None:
                assert tracer is not None
                tracer.end(span, result, error)

    async def _call(
        self,
        identity: Identity,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
        lease_header: str | None,
        credential: LeaseClaims | None,
        seen: list[LeaseClaims | None],
    ) -> dict[str, Any] | Refusal:
        screened = self.screen(identity, name, meta, lease_header, credential, seen=seen)
        if isinstance(screened, Refusal):
            return screened
        lease, meta = screened
        run = lease.run if lease is not None else None
        tripwires = self.tripwires
        if tripwires is None:
            return await self._admitted(identity, name, arguments, meta, progress, lease, run)
        entry = CURRENT.get() if self.call_log is not None else None
        try:
            result = await self._admitted(identity, name, arguments, meta, progress, lease, run)
        except MCPError:
            # The upstream's JSON-RPC error (passed on as is), or an unknown tool: an error outcome.
            if entry is not None and self.call_log is not None:
                self.call_log.outcome(entry, FAILED)
            await tripwires.settle(identity, name, run, FAILED)
            raise
        if entry is not None and self.call_log is not None:
            self.call_log.outcome(entry, result)  # before the judgement replaces it
        return await tripwires.settle(identity, name, run, result)

    def screen(
        self,
        identity: Identity,
        tool: str | None,
        meta: dict[str, Any] | None,
        lease_header: str | None,
        credential: LeaseClaims | None,
        model: str | None = None,
        seen: list[LeaseClaims | None] | None = None,
    ) -> tuple[LeaseClaims | None, dict[str, Any] | None] | Refusal:
        """Steps 5 to 5c, before anything is routed or counted: the kill switch, the lease, the
        stops, the tripwires' latch. The one rule for a tool call and a model call (``tool`` None
        and the ``model`` asked for, ``haltwire.gateway.model_calls``: ``model:`` stops reach it,
        no ``tool:`` stop does). Answers the call's lease (None: in no run) and ``meta`` without
        the lease token, or the refusal; ``seen`` is given the lease once it is verified (so a
        refusal after that names the run)."""
        if self.suspensions.is_suspended(identity.agent):
            return refusal.agent_suspended(identity.agent)
        lease: LeaseClaims | None = credential
        leases = self.leases
        if credential is not None:
            if meta is not None and LEASE_META in meta:
                meta = without_lease(meta)
        elif leases is not None:
            checked = leases.check(identity, meta, lease_header)
            if isinstance(checked, Refusal):
                return checked
            lease = checked
            if lease is not None and meta is not None and LEASE_META in meta:
                meta = without_lease(meta)  # the token is this gateway's, not the upstream's
        run = lease.run if lease is not None else None
        if seen is not None:
            seen.append(lease)
        if (entry := CURRENT.get() if self.call_log is not None else None) is not None:
            entry.run = run
        if self.stops is not None and (stopped := stop_refusal(self.stops, identity, tool, lease, model)) is not None:
            return stopped  # before routing and ceilings: a stopped call consumes nothing
        if entry is not None:
            entry.stage = "latch"
        tripwires = self.tripwires
        if tripwires is not None and (tripped := tripwires.latched(identity, tool, run)) is not None:
            return tripped
        return lease, meta

    async def _admitted(
        self,
        identity: Identity,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
        lease: LeaseClaims | None,
        run: str | None,
    ) -> dict[str, Any] | Refusal:
        """From routing on: the ceilings, the tripwires' admission, then the call itself."""
        route = self.upstreams.route(name)
        desk = None
        if route is None and (desk := self._status_tool(name)) is None:
            raise UnknownTool(name)
        if self.call_log is not None:
            reached("routed")
        ticket = await self.admit(identity, name, run, arguments)
        if isinstance(ticket, Refusal):
            return ticket
        try:
            if route is None:
                assert desk is not None
                return await desk.status(identity, arguments, ticket.deadline_s)
            if route.label == "irreversible" and self.intents is not None:
                # After admission, like bounded: a refused call records nothing.
                return await self.intents.propose(
                    identity, run, route.upstream.name, route.tool, name, arguments, meta, ticket.deadline_s
                )
            if route.label == "bounded" and self.idempotency is not None:
                # After admission, so a refused call consumes no key.
                idempotency = self.idempotency

                async def forward(keyed: dict[str, Any] | None) -> dict[str, Any] | Refusal:
                    return await self._forward(
                        identity, lease, route, name, arguments, keyed, progress, ticket.deadline_s
                    )

                return await idempotency.call(identity, run, name, arguments, meta, forward)
            return await self._forward(
                identity, lease, route, name, arguments, meta, progress, ticket.deadline_s
            )
        finally:
            await released(ticket, identity)

    async def admit(
        self,
        identity: Identity,
        name: str,
        run: str | None,
        arguments: dict[str, Any] | None,
        step: bool = True,
    ) -> Ticket | Refusal:
        """Admission, for a tool call and a model call (``model:NAME``) alike: the tripwires'
        counts of the call (``Tripwires.plan``) taken with the ceilings' in one atomic admission,
        then judged (``Tripwires.judge``). ``step``: ``Ceilings.admit``'s. The ticket's slots are
        held until ``released``."""
        tripwires = self.tripwires
        plan = None if tripwires is None else tripwires.plan(identity, name, run, arguments)
        if isinstance(plan, Refusal):
            return plan
        ticket = await self.ceilings.admit(identity, name, run, () if plan is None else plan.ops, step)
        if isinstance(ticket, Refusal):
            return ticket
        if self.call_log is not None:
            reached("admitted")
        if plan is not None:
            assert tripwires is not None
            if (tripped := tripwires.judge(plan, ticket.tallied)) is not None:
                await released(ticket, identity)
                return tripped
        return ticket

    async def _forward(
        self,
        identity: Identity,
        lease: LeaseClaims | None,
        route: Route,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
        deadline_s: float,
    ) -> dict[str, Any] | Refusal:
        inflight = self.inflight
        call = None if inflight is None else inflight.start(identity, name, route.label, lease)
        if isinstance(call, Refusal):
            return call  # a stop since step 5b: nothing reached the upstream
        # What the call ended as, should it end by an exception from outside (client gone).
        outcome: Outcome = "abandoned"
        try:
            # One scope cuts the call: a stop that reaches a cancellable call in flight cancels
            # ``call.scope`` (``inflight.InFlight``), and the deadline is that scope's. Either
            # way the upstream request is closed, so the upstream sees the cancellation.
            scope = call.scope if call is not None else anyio.CancelScope()
            scope.deadline = anyio.current_time() + deadline_s
            with scope:
                started = time.perf_counter()
                try:
                    result = await route.upstream.call_tool(route.tool, arguments, meta, progress)
                finally:
                    self.metrics.upstream_duration(route.upstream.name, time.perf_counter() - started)
                outcome = "failed" if result.get("isError") else "completed"
                return result
            # Only reached when the scope was cancelled: by a stop, whose refusal the agent is
            # answered, or by the deadline.
            if call is not None and call.refusal is not None:
                outcome = "cancelled"
                return call.refusal
            raise TimeoutError
        except TimeoutError:
            outcome = "deadline_exceeded"
            # An irreversible call cut off here may have happened: its outcome is unknown.
            irreversible = route.label == "irreversible"
            return refusal.deadline_exceeded(name, deadline_s, irreversible=irreversible)
        except UpstreamUnavailable as exc:
            outcome = "upstream_unavailable"
            log.warning("upstream unavailable: %s", exc)
            return refusal.upstream_unavailable(route.upstream.name)
        except MCPError:
            outcome = "failed"
            raise
        finally:
            if call is not None:
                assert inflight is not None
                inflight.end(call, outcome)
