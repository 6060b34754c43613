"""Model calls through the gateway (issue 14): ``POST /v1/chat/completions`` and
``POST /v1/responses``, forwarded to the ``[[models]]`` provider with its key, streamed or not.

The agent's haltwire token is its API key; the provider's key is added here and never leaves
the gateway. A model call takes the tool call's pipeline, by the same code, in the same order:

0. the edge (``haltwire.gateway.app``): Host and Origin, the bearer token to an identity (401),
   an identity suspended at the edge (403), the body within ``max_body_bytes`` (413) and read
   by the strict JSON parser; here, a body that is not an object naming a ``model`` (422);
1. ``Gateway.screen`` (``haltwire.gateway.proxy``, steps 5 to 5c): the kill switch, the lease
   (``Haltwire-Lease`` header; a broker credential stands for it), the stops on every scope of
   the call (global, tenant, version, agent, its run, and ``model:NAME`` for the model it asks
   for; never a ``tool:`` stop) and the lease's fence, the tripwires' latch;
2. the route: the model name to its provider (``haltwire.gateway.models``), else
   ``unknown_model`` (404, judged by the tripwires' result rules as a tool call to an unknown
   tool is). The call is named ``model:NAME`` from here on (``model:PREFIX*`` for a model
   routed by a prefix) for its limits, its tripwire rules and the call log;
3. ``Gateway.admit``, the tool call's admission: the tripwires' admission counts of the call
   (``Tripwires.plan``: ``steps``/``rate`` rules naming it, the held trips, and the check of its
   run's ``tokens``/``model_cost`` counts) taken with ``Ceilings.admit``'s in one atomic
   admission (one step of the identity's budget and of the run's ``run_steps``, one slot of its
   in-flight caps; ``[limits.tools."model:NAME"]`` applies as to a tool), then judged
   (``Tripwires.judge``: ``tripwire_tripped``); a refusal here is judged by the result rules
   before it is answered; the slot is held until the answer or the stream has ended;
4. in flight (``haltwire.gateway.inflight``, with ``[control]``): one more stop verdict, then
   registered as a ``cancellable`` call ``model:MODEL`` (the model's own name, for the run
   report): a stop that matches it cuts it at once
   (the provider's request is closed, so the provider sees the connection close and stops
   generating) and the client is answered the ``stopped`` refusal: as an HTTP 403 if nothing
   was sent yet, else as the stream's last event (``models.error_event``); the cut is reported
   to the control plane for the run report, as a tool call's is;
5. the provider call under the call's deadline (the ceilings' for ``model:NAME``; past it,
   ``deadline_exceeded``); the provider unreachable: ``upstream_unavailable`` (503);
   the provider's answer, body or stream, is relayed as it came (``models``, headers aside).
   With a usage rule on the call, its usage goes to ``Tripwires.spent`` as soon as it is read
   (a whole answer before it is sent, a stream's usage event before it is relayed), and a whole
   answer is judged (``Tripwires.settle``: an error status is a policy hit) before it is sent:
   a client that has its answer makes its next call on both;
6. finally: the slots released (shielded); a stream's outcome (and a refusal's, a cut's) judged
   by ``Tripwires.settle``; a stream that ended without its usage counted from what was
   relayed (``Relay.estimate``) and given to ``Tripwires.spent``; the tokens and their cost
   counted (``haltwire.gateway.usage``, ``[[models]] prices``) and, for a run, queued for its
   report (``haltwire.gateway.outcomes``).

With ``[call_log]`` the call is recorded as a call to ``model:NAME`` with its outcome and usage
(``haltwire.tripwires.calllog``), from step 1 on, as a tool call is. A client that disconnects
cancels the call: the provider's request is closed too (its outcome is not judged, as a tool
call's cancellation is not). Refusals are answered in OpenAI's error shape
(``models.refusal_response``), terminal ones as 403 with ``x-should-retry: false``, so the
OpenAI client raises them once without retrying. Not for model calls: the tripwire kinds that
read a tool's arguments or result (``money``, ``repeated_*``, ``content``), and refusal as a
tool result (a model call always gets its refusal as an HTTP answer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any, Final

import anyio
from starlette.types import Receive, Scope, Send

from haltwire import jsonwire, refusal
from haltwire.errors import describe
from haltwire.gateway.models import (
    PROVIDER_ERRORS,
    EventSplitter,
    ModelRoutes,
    Provider,
    ProviderUnavailable,
    forwarded_headers,
    open_call,
    returned_headers,
)
from haltwire.gateway.outcomes import CallReports, Outcome
from haltwire.gateway.proxy import FAILED, RELEASE_TIMEOUT_S, Gateway, released
from haltwire.gateway.relay import Relay, respond
from haltwire.gateway.usage import Tokens, Usage, UsageCounts, answer_tokens, wants_usage
from haltwire.gateway.wire import BodyTooLarge, DisconnectWatch, read_body
from haltwire.identity import Identity
from haltwire.limits import MAX_NAME_CHARS, has_control_characters
from haltwire.logs import log_refusal
from haltwire.meta import LEASE_HEADER
from haltwire.metrics import UNKNOWN, outcome_of
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims
from haltwire.tripwires.calllog import CURRENT, reached
from haltwire.tripwires.usage import Spent

log = logging.getLogger("haltwire.gateway")

#: What the tripwires judge a model call the provider answered (200) by: a result, no error.
SERVED: Final[dict[str, Any]] = {"isError": False, "content": []}


class ModelCalls:
    """The model endpoints, behind the edge (see the module's docstring for the order)."""

    def __init__(
        self, gateway: Gateway, routes: ModelRoutes, usage: UsageCounts, reports: CallReports | None = None
    ) -> None:
        self.gateway = gateway
        self.routes = routes
        self.usage = usage
        #: With ``[control]``: a run's usage goes to its report too.
        self.reports = reports

    async def serve(
        self,
        path: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        identity: Identity,
        credential: LeaseClaims | None,
        max_body_bytes: int,
    ) -> None:
        """Serve one model call of ``identity``, which the edge resolved (its body is still unread)."""
        try:
            body = await read_body(receive, max_body_bytes)
        except BodyTooLarge:
            await respond(send, refusal.payload_too_large(max_body_bytes))
            return
        try:
            request: Any = jsonwire.loads(body)  # the edge's one strict parser
        except (ValueError, RecursionError):  # jsonwire.NotJson too: then no model is named
            request = None
        model = request.get("model") if isinstance(request, dict) else None
        if not isinstance(model, str) or not model:
            await respond(send, refusal.model_request_invalid("the body is not a JSON object naming a model"))
            return
        assert isinstance(request, dict)
        routed = self.routes.route(model)
        # How its limits, its tripwire rules and the call log know it: the model, or PREFIX* when
        # routed by a prefix (so names made up under a prefix share one set of counts).
        name = f"model:{model if routed is None else routed[1]}"
        calls = self.gateway.call_log
        metrics = self.gateway.metrics
        entry = calls.begin(identity, name, None, None) if calls is not None else None
        token = CURRENT.set(entry) if entry is not None else None
        result: dict[str, Any] | Refusal | None = None
        started = time.perf_counter()
        metrics.in_flight += 1
        seen: list[LeaseClaims | None] = []
        try:
            result = await self._serve(
                path, scope, receive, send, identity, credential, request, body, name, routed, seen
            )
        finally:
            metrics.in_flight -= 1
            metrics.model_duration(time.perf_counter() - started)
            metrics.model_calls.count(UNKNOWN if routed is None else routed[1], outcome_of(result))
            if isinstance(result, Refusal):
                metrics.refused(result)
                lease = seen[0] if seen else None
                log_refusal(log, identity, name, None if lease is None else lease.run, result)
            if calls is not None and entry is not None and token is not None:
                CURRENT.reset(token)
                calls.end(entry, result, "cancelled")

    async def _serve(
        self,
        path: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        identity: Identity,
        credential: LeaseClaims | None,
        request: dict[str, Any],
        body: bytes,
        name: str,
        routed: tuple[Provider, str] | None,
        seen: list[LeaseClaims | None],
    ) -> dict[str, Any] | Refusal | None:
        """Steps 1 to 7 (the module's docstring); the call's outcome as the tripwires judge it
        (None: the client went)."""
        gateway = self.gateway
        model = str(request["model"])
        lease_header = None
        if gateway.leases is not None:
            lease_header = next(
                (v.decode("latin-1") for k, v in scope["headers"] if k == LEASE_HEADER.encode()), None
            )
        screened = gateway.screen(identity, None, None, lease_header, credential, model, seen)
        if isinstance(screened, Refusal):
            await respond(send, screened)
            return screened
        lease = screened[0]
        run = lease.run if lease is not None else None
        # A refusal is judged before it is answered, as a tool call's (the client's next call
        # meets its judgement).
        if routed is None:
            unknown = refusal.unknown_model(model)
            await self._judged(identity, name, run, unknown)  # as a tool call to an unknown tool
            await respond(send, unknown)
            return unknown
        provider, limited_as = routed
        if gateway.call_log is not None:
            reached("routed")
        ticket = await gateway.admit(identity, name, run, None, provider.route.counts_as_step)
        if isinstance(ticket, Refusal):
            await self._judged(identity, name, run, ticket)
            await respond(send, ticket)
            return ticket
        stream = request.get("stream") is True
        strip_usage = stream and path == "/v1/chat/completions" and not wants_usage(request)
        if strip_usage:
            # The provider sends the usage of a stream only when asked (see haltwire.gateway.usage).
            options = request.get("stream_options")
            options = (
                {**options, "include_usage": True} if isinstance(options, dict) else {"include_usage": True}
            )
            body = json.dumps({**request, "stream_options": options}, separators=(",", ":")).encode()
        relay = Relay(send, path, strip_usage)
        price = provider.route.price(model)
        tripwires = gateway.tripwires
        spent: Spent | None = None

        async def count(tokens: Tokens) -> None:
            """The call's usage, in the usage rules' counts (and the call log's record)."""
            nonlocal spent
            spent = Spent(
                tokens.input, tokens.output, 0 if price is None else price.micros(tokens.input, tokens.output)
            )
            if (entry := CURRENT.get() if gateway.call_log is not None else None) is not None:
                entry.usage = spent
            if tripwires is not None:
                await tripwires.spent(identity, name, run, spent)

        judged = False

        async def judge(status: int) -> None:
            nonlocal judged
            judged = True
            await self._judged(identity, name, run, SERVED if status == 200 else FAILED)

        # Counted as soon as the usage is read, and a whole answer judged, before the answer's
        # last bytes are relayed: a client that has read its answer makes its next call on them.
        if tripwires is not None and tripwires.counts_usage(name):
            relay.on_tokens = count
        if tripwires is not None or gateway.call_log is not None:
            relay.on_whole = judge
        result: dict[str, Any] | Refusal | None = None
        try:
            result = await self._call(
                identity, lease, model, provider, path, scope, receive, body, relay, ticket.deadline_s
            )
        finally:
            await released(ticket, identity)
            with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
                if spent is None and (tokens := relay.tokens or relay.estimate(len(body))) is not None:
                    await count(tokens)  # no usage rule, or a stream that ended without its usage
                if result is not None and not judged:
                    await self._judged(identity, name, run, result)
                if spent is not None:
                    await self.usage.add(identity, run, Usage(spent.input, spent.output, spent.money_micros))
                    if run is not None and self.reports is not None:
                        # A name the control plane would refuse (the agent chose it) is reported as routed.
                        fit = len(model) <= MAX_NAME_CHARS and not has_control_characters(model)
                        self.reports.record_usage(
                            run, model if fit else limited_as, spent.input, spent.output, spent.money_micros
                        )
        return result

    async def _judged(
        self, identity: Identity, name: str, run: str | None, result: dict[str, Any] | Refusal
    ) -> None:
        """The outcome in the call log, then judged by the tripwires' result rules, as a tool
        call's is (``Gateway._call``); a model call's answer is never replaced (no content rule
        reads one)."""
        calls = self.gateway.call_log
        if calls is not None and (entry := CURRENT.get()) is not None:
            calls.outcome(entry, result)
        if (tripwires := self.gateway.tripwires) is not None:
            await tripwires.settle(identity, name, run, result)

    async def _call(
        self,
        identity: Identity,
        lease: LeaseClaims | None,
        model: str,
        provider: Provider,
        path: str,
        scope: Scope,
        receive: Receive,
        body: bytes,
        relay: Relay,
        deadline_s: float,
    ) -> dict[str, Any] | Refusal | None:
        """The call in flight; its outcome as the tripwires judge it (the provider's answer: served
        or an error; a refusal; None: the client went)."""
        inflight = self.gateway.inflight
        name = f"model:{model}"  # in the run report
        call = None if inflight is None else inflight.start(identity, name, "cancellable", lease, model=model)
        if isinstance(call, Refusal):
            await relay.refuse(call)  # a stop since the screen: nothing reached the provider
            return call
        outcome: Outcome = "abandoned"
        result: dict[str, Any] | Refusal | None = None
        gone = False

        exchange = anyio.CancelScope()  # cut when the client goes

        def went() -> None:
            nonlocal gone
            if relay.ended:
                return  # the answer is over (the server says "disconnect" from then on): served
            gone = True
            exchange.cancel()

        headers = forwarded_headers(scope["headers"])
        try:
            with call.scope if call is not None else contextlib.nullcontext(), anyio.fail_after(deadline_s):
                with DisconnectWatch(scope, receive, went), exchange:
                    await self._exchange(provider, path, body, headers, relay)
                if not gone:
                    outcome = "completed" if relay.status == 200 else "failed"
                    result = SERVED if relay.status == 200 else FAILED
            if call is not None and call.refusal is not None and call.scope.cancelled_caught:
                outcome = "cancelled"  # a stop cut it: the client is told so, the report too
                result = call.refusal
                await relay.refuse(call.refusal)
        except TimeoutError:
            outcome = "deadline_exceeded"
            result = refusal.deadline_exceeded(name, deadline_s)
            await relay.refuse(result)
        except ProviderUnavailable as exc:
            outcome = "upstream_unavailable"
            log.warning("model provider unavailable: %s", exc)
            result = refusal.provider_unavailable(provider.name)
            await relay.refuse(result)
        finally:
            if call is not None:
                assert inflight is not None
                inflight.end(call, outcome)
        return result

    async def _exchange(
        self, provider: Provider, path: str, body: bytes, headers: list[tuple[str, str]], relay: Relay
    ) -> None:
        """Send the call to the provider and relay its answer; the provider's request is closed on
        the way out, whatever ends it (a stop, the deadline, the client gone)."""
        response = await open_call(provider, path, body, headers)
        read = False  # the answer read to its end: its connection is kept for the next call
        try:
            kind = response.headers.get("content-type", "")
            if response.status != 200 or not kind.startswith("text/event-stream"):
                try:
                    data = await response.read()
                except PROVIDER_ERRORS as exc:
                    raise ProviderUnavailable(f"{provider.name}: {describe(exc)}") from exc
                read = True
                if response.status == 200:
                    relay.tokens = answer_tokens(data)
                await relay.whole(response.status, returned_headers(response), data)
                return
            await relay.start_stream(response.status, returned_headers(response))
            splitter = EventSplitter()
            while True:
                try:
                    chunk = await response.content.readany()
                except PROVIDER_ERRORS as exc:
                    # The provider broke off mid-stream: the client's stream ends where it did.
                    log.warning("model provider %s broke off a stream: %s", provider.name, describe(exc))
                    break
                if not chunk:
                    read = True
                    break
                await relay.events(splitter.feed(chunk))
            await relay.end(splitter.rest())
        finally:
            # Closing drops the connection: how the provider learns the call is over (it stops
            # generating); a cut stream's connection is never reused.
            if read:
                response.release()
            else:
                response.close()
