"""The gateway's ASGI application: the HTTP edge, and the fast path for ``tools/call``.

Every request but the probes (``/healthz``, ``/readyz``) and ``/metrics`` (no token: counts, no
identity or run, ``haltwire.metrics``) names the gateway first (``haltwire.gateway.hosts``): a ``Host``
it is not served under gets 421, an ``Origin`` that may not call it 403 (DNS-rebinding protection,
before anything else, whatever the method). Then every request to ``/mcp`` passes the edge:

1. the bearer token resolves to an identity (``haltwire.gateway.identities``), or the answer is 401;
2. an identity suspended at the edge gets 403;
3. a body larger than ``max_body_bytes`` gets 413, and one holding what is not JSON (NaN, Infinity, 1e400,
   an unpaired surrogate: ``haltwire.jsonwire``) a JSON-RPC parse error (400), before anything is counted;
4. a broker credential that a stop has revoked (stopped, or fenced since) gets 403 on every request but a
   ``tools/call``, which the pipeline refuses as a tool result; so does one while the watch is stale (503).

Then a ``tools/call`` takes the fast path here: a modern (2026-07-28) one once the SDK's own ladder
(``classify_inbound_request``) and ``Mcp-Param-*`` check accept its envelope, a handshake-era one
(``haltwire.gateway.legacy``) once its headers are what the SDK's handler takes; the ``Gateway``
pipeline runs and the JSON-RPC answer is written as the SDK would write it for the client's version.
Anything else (``initialize``, discovery, ``tools/list``, a request the fast path does not
recognise) is replayed, body and all, into the official SDK's streamable-HTTP handler, so protocol
corner cases have one implementation. The fast path exists because the SDK's server machinery costs
more per call than every check haltwire makes (``benchmarks/gateway.py`` measures both).

With ``[[models]]``, ``POST /v1/chat/completions`` and ``POST /v1/responses`` pass the same edge (steps 1 to
3), then ``haltwire.gateway.model_calls`` serves them. Beside ``/mcp``, without authentication: ``/healthz``
answers 200 as soon as the port is served (liveness), ``/readyz`` 200 only once the gateway is started, its
upstreams connected and its stops current, else 503 naming what is missing (readiness,
``haltwire.gateway.readiness``). ``haltwire gateway`` serves its port while it starts, so both answer then;
a request to ``/mcp`` that comes before the start has finished waits for it.

Cancellation: a client that disconnects before its answer cancels the call (``wire.DisconnectWatch``:
haltwire's listener says when the connection is lost; under another ASGI server a plain task
watches ``receive``), with a progress token the task group that also streams the notifications;
that cancels the upstream request (the upstream sees its stream close) and releases the slot."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Final

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    validate_mcp_param_headers,
)
from mcp_types import INTERNAL_ERROR, PARSE_ERROR
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import Receive, Scope, Send

from haltwire import jsonwire, refusal
from haltwire.errors import unwrapped
from haltwire.gateway import legacy
from haltwire.gateway.credentials import CREDENTIAL_STATE_KEY
from haltwire.gateway.hosts import HostCheck
from haltwire.gateway.identities import Identities
from haltwire.gateway.model_calls import ModelCalls
from haltwire.gateway.models import MODEL_PATHS
from haltwire.gateway.progress import Outcome, with_progress
from haltwire.gateway.proxy import Gateway
from haltwire.gateway.readiness import NOT_STARTED, Start, readiness
from haltwire.gateway.relay import respond as respond_model
from haltwire.gateway.server import IDENTITY_STATE_KEY, build_server
from haltwire.gateway.stops import credential_refusal
from haltwire.gateway.wire import (
    BodyTooLarge,
    counted,
    is_tool_call,
    jsonrpc_error,
    jsonrpc_result,
    read_body,
    replayed,
    respond,
    respond_refusal,
    until_disconnect,
)
from haltwire.identity import Identity, bearer_token
from haltwire.meta import LEASE_HEADER
from haltwire.metrics import CONTENT_TYPE, exposition
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims
from haltwire.upstreams.http import Progress

log = logging.getLogger("haltwire.gateway")

_METRICS_HEADERS: Final = [(b"content-type", CONTENT_TYPE.encode())]
#: The headers the fast path reads: the envelope ladder's three, ``Accept``, ``Content-Type``
#: (a handshake-era call's) and the lease.
_PICKED: Final = frozenset(
    {b"mcp-protocol-version", b"mcp-method", b"mcp-name", b"accept", b"content-type", LEASE_HEADER.encode()}
)
#: A body that is not JSON at all: the SDK's handler answers it.
_UNPARSED: Final = object()


def _picked(scope: Scope) -> dict[str, str]:
    """The headers of ``_PICKED`` that the request has (the last one of a repeated header)."""
    return {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _PICKED}


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


class GatewayApp:
    """ASGI app: the edge, the fast path, and the SDK server for everything else."""

    def __init__(
        self,
        gateway: Gateway,
        identities: Identities,
        *,
        max_body_bytes: int = 1_048_576,
        version: str = "0",
        on_startup: Callable[[AsyncExitStack], Awaitable[None]] | None = None,
        hosts: HostCheck | None = None,
        models: ModelCalls | None = None,
    ) -> None:
        self.gateway = gateway
        #: The model endpoints (``[[models]]``); None: there are none.
        self.models = models
        #: The Host and Origin values served; by default loopback names only.
        self.hosts = hosts if hosts is not None else HostCheck((), (), "127.0.0.1")
        #: Bearer token to identity: the token table, and an issuer's or the broker's JWTs.
        self.identities = identities
        self.max_body_bytes = max_body_bytes
        self._on_startup = on_startup
        #: The start, as calls that come during it see it.
        self.start_state = Start()
        self._server_info = {"io.modelcontextprotocol/serverInfo": {"name": "haltwire", "version": version}}
        self._manager = StreamableHTTPSessionManager(
            app=build_server(gateway, version),
            stateless=True,
            json_response=False,
            # Host and Origin are checked before the SDK sees a request (``self.hosts``), for
            # the fast path too, against the gateway's own allow-lists.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=max_body_bytes,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/")
        if path == "/healthz":
            # Probed by address (load balancers, orchestrators); it says nothing but "up".
            await respond(send, 200, b'{"ok":true}')
            return
        if path == "/readyz":
            # Probed by address too; it names what is not ready, nothing secret.
            await respond(send, *readiness(self.gateway, self.started))
            return
        if path == "/metrics":  # scraped by address, no token: counts, no identity or run in them
            await respond(send, 200, exposition(self.gateway.metrics.registry), _METRICS_HEADERS)
            return
        refused = self.hosts.refusal(scope["headers"])
        if refused is not None:
            await respond(send, *refused)
            return
        if path in MODEL_PATHS and self.models is not None and scope["method"] == "POST":
            if not self.started and not await self.start_state.wait():
                await respond(send, 503, NOT_STARTED)
                return
            # The same edge, its refusals in OpenAI's shape; the rest is haltwire.gateway.model_calls.
            if (who := await self._who(scope, send, respond_model)) is not None:
                await self.models.serve(path, scope, receive, send, *who, self.max_body_bytes)
            return
        if path != "/mcp":
            await respond(
                send, 404, b'{"error":{"code":"not_found","message":"Not found.","retryable":false}}'
            )
            return
        if not self.started and not await self.start_state.wait():
            await respond(send, 503, NOT_STARTED)
            return
        await self._edge(scope, receive, send)

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect the upstreams and start the SDK handler; ``stack`` owns both until it closes.

        A start-up failure (an upstream that does not start) is raised as itself, not
        wrapped in the exception group of the task group it happened in.
        """
        try:
            with unwrapped():
                async with AsyncExitStack() as local:
                    if self._on_startup is not None:
                        await self._on_startup(local)
                    await local.enter_async_context(self._manager.run())
                    stack.push_async_exit(local.pop_all())
        except BaseException:
            self.start_state.given_up()
            raise
        self.start_state.finished()

    @property
    def started(self) -> bool:
        return self.start_state.done

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        # Used when an ASGI server runs the app with lifespan on; ``haltwire gateway`` serves
        # it without and calls ``start`` itself, so that a failing upstream is a clear start-up
        # error and /readyz answers during the start.
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with AsyncExitStack() as stack:
            if not self.started:
                try:
                    await self.start(stack)
                except Exception as exc:
                    log.error("%s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})

    async def _who(
        self, scope: Scope, send: Send, refuse: Callable[[Send, Refusal], Awaitable[None]]
    ) -> tuple[Identity, LeaseClaims | None] | None:
        """Edge steps 1 to 3: the caller's identity (and broker credential), or None once refused."""
        if not isinstance(refused := await self._edge_refusal(scope), Refusal):
            return refused
        self.gateway.metrics.refused(refused)
        await refuse(send, refused)
        return None

    async def _edge_refusal(self, scope: Scope) -> tuple[Identity, LeaseClaims | None] | Refusal:
        token = bearer_token((_header(scope, b"authorization") or b"").decode("latin-1"))
        if token is None:
            return refusal.unauthenticated("no bearer token was sent")
        resolved = await self.identities.resolve(token)
        if isinstance(resolved, Refusal):
            return resolved
        if resolved[0].suspended_at_edge:
            return refusal.agent_suspended(resolved[0].agent)
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return refusal.payload_too_large(self.max_body_bytes)
        return resolved

    async def _refused(self, send: Send, r: Refusal) -> None:
        self.gateway.metrics.refused(r)  # an edge refusal: counted, as the pipeline's are
        await respond_refusal(send, r)

    async def _edge(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = await self._who(scope, send, respond_refusal)
        if who is None:
            return
        identity, credential = who
        state = scope.setdefault("state", {})
        state[IDENTITY_STATE_KEY] = identity
        state[CREDENTIAL_STATE_KEY] = credential  # the SDK path reads it too (server.py)
        # A stopped or fenced credential authenticates nothing: every request is refused here,
        # but a tool call, which the pipeline refuses as a tool result the agent reads.
        watch, revoked = self.gateway.stops, None
        if credential is not None and watch is not None:  # [broker] needs [control]
            revoked = credential_refusal(watch, credential)
        message: Any = _UNPARSED
        if scope["method"] == "POST":
            try:
                body = await read_body(receive, self.max_body_bytes)
            except BodyTooLarge:
                await self._refused(send, refusal.payload_too_large(self.max_body_bytes))
                return
            # Every body is read by the one strict parser, whichever path serves it: the SDK's
            # parser takes NaN and 1e400, the fast path's (Python's) unpaired surrogates too,
            # which nothing after them can write back as JSON.
            try:
                message = jsonwire.loads(body)
            except jsonwire.NotJson as exc:
                await respond(send, 400, jsonrpc_error(None, PARSE_ERROR, f"Parse error: {exc}"))
                return
            except (ValueError, RecursionError):
                pass  # not JSON at all: the SDK answers it with its own parse error
            receive = replayed(body, receive)
        if revoked is not None and not is_tool_call(message):
            await self._refused(send, revoked)
            return
        if is_tool_call(message) and await self._tools_call(
            identity, message, scope, receive, send, credential
        ):
            return
        try:
            # The SDK reads the body before it answers; past the limit, its own 413 is plain text.
            await self._manager.handle_request(scope, counted(receive, self.max_body_bytes), send)
        except BodyTooLarge:
            await self._refused(send, refusal.payload_too_large(self.max_body_bytes))

    async def _tools_call(
        self,
        identity: Identity,
        msg: dict[str, Any],
        scope: Scope,
        receive: Receive,
        send: Send,
        credential: LeaseClaims | None = None,
    ) -> bool:
        """Serve a ``tools/call`` (the body, parsed), modern or handshake-era (``gateway.legacy``);
        False hands the request to the SDK instead."""
        if msg.get("jsonrpc") != "2.0" or msg.get("method") != "tools/call":
            return False
        request_id = msg.get("id")
        params = msg.get("params")
        if (
            isinstance(request_id, bool)
            or not isinstance(request_id, str | int)
            or not isinstance(params, dict)
        ):
            return False
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            return False
        picked = _picked(scope)
        accept = picked.get("accept", "")
        legacy_version = None
        if picked.get("mcp-protocol-version") in MODERN_PROTOCOL_VERSIONS:
            if picked.get("mcp-method") != "tools/call":
                return False
            if "application/json" not in accept and "*/*" not in accept:
                return False
            if isinstance(classify_inbound_request(msg, headers=picked), InboundLadderRejection):
                return False
            # Only a tool whose schema declares Mcp-Param-* headers has headers to check.
            schema = self.gateway.upstreams.param_header_schema(name)
            if schema is not None:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                if validate_mcp_param_headers(schema, arguments or {}, headers) is not None:
                    return False
        else:
            legacy_version = legacy.served_version(picked, params)
            if legacy_version is None:
                return False

        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else None
        token = meta.get("progressToken") if meta else None
        wants_progress = (
            legacy_version is None
            and isinstance(token, str | int)
            and not isinstance(token, bool)
            and "text/event-stream" in accept
        )
        # The header is looked for only by a gateway that verifies leases.
        lease_header = picked.get(LEASE_HEADER) if self.gateway.leases is not None else None
        await self._serve_call(
            identity,
            request_id,
            name,
            arguments,
            meta,
            token,
            wants_progress,
            scope,
            receive,
            send,
            lease_header,
            credential,
            legacy_version,
        )
        return True

    async def _serve_call(
        self,
        identity: Identity,
        request_id: str | int,
        name: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        token: Any,
        wants_progress: bool,
        scope: Scope,
        receive: Receive,
        send: Send,
        lease_header: str | None = None,
        credential: LeaseClaims | None = None,
        legacy_version: str | None = None,
    ) -> None:
        async def call(progress: Progress | None) -> Outcome:
            try:
                return await self.gateway.call_tool(
                    identity, name, arguments, meta, progress, lease_header, credential, (request_id, None)
                )
            except MCPError as exc:
                return exc

        if wants_progress:
            result, committed_sse = await with_progress(call, token, receive, send, scope)
        else:
            # No progress to stream: the call runs in this task, cancelled if the client goes.
            result, committed_sse = await until_disconnect(call(None), receive, scope), False
        if result is None:
            return  # the client went away; nothing to answer
        if legacy_version is not None:
            await respond(send, 200, legacy.answer(request_id, result, legacy_version), legacy.HEADERS)
            return
        await self._answer(identity, request_id, result, committed_sse, send)

    async def _answer(
        self, identity: Identity, request_id: str | int, result: Outcome, committed_sse: bool, send: Send
    ) -> None:
        """Write ``result`` as the JSON-RPC answer (after the events, once an SSE response started)."""
        status = 200
        if isinstance(result, MCPError):
            payload = jsonrpc_error(request_id, result.code, result.message, result.data)
            status = ERROR_CODE_HTTP_STATUS.get(result.code, 200 if result.code != INTERNAL_ERROR else 500)
        elif isinstance(result, Refusal):
            if identity.refuse_at == "edge" and not committed_sse:
                await respond_refusal(send, result)
                return
            payload = jsonrpc_result(request_id, self._stamp(result.tool_result()))
        else:
            payload = jsonrpc_result(request_id, self._stamp(result))
        if committed_sse:
            data = payload.decode()
            await send(
                {"type": "http.response.body", "body": f"event: message\r\ndata: {data}\r\n\r\n".encode()}
            )
        else:
            await respond(send, status, payload)

    def _stamp(self, result: dict[str, Any]) -> dict[str, Any]:
        result.setdefault("resultType", "complete")
        meta = result.get("_meta")
        result["_meta"] = {**meta, **self._server_info} if isinstance(meta, dict) else self._server_info
        return result
