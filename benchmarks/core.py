"""haltwire's pipeline on the floor's server, for ``benchmarks/gateway_ab.py --with core``.

What a call would cost if haltwire's HTTP layer were the floor's (``floor.py``: uvloop and
httptools' parser, callbacks, no ASGI server): the gateway built from its config as ``haltwire
gateway`` builds it, its upstreams connected and its stores started, and each ``tools/call``
taken through ``Gateway.call_tool`` (kill switch, lease, stops, admission, the h1 upstream client,
release, metrics) and answered as the fast path answers it. The edge is the bearer token alone:
no Host or Origin check, no envelope ladder, no body limit, no disconnect watch, no header
timeouts. Its distance from ``haltwire`` is what uvicorn's ASGI cycle and the edge cost; its
distance from ``floor`` is what the pipeline and the upstream client cost. A measuring stick for
a call path rewritten at the floor's level, not a server to run.

With ``--edge`` (``gateway_ab.py --with core+edge``) the server runs the whole ``GatewayApp``
instead, every check of the edge included (Host and Origin, token, body limit, strict JSON, the
envelope ladder, the disconnect watch through ``ON_DISCONNECT``), handed a scope, ``receive`` and
``send`` built by this protocol in place of uvicorn's request cycle. Its distance from ``core`` is
what the edge's checks cost; its distance from ``haltwire`` what uvicorn's cycle and ``_Corked``
cost: what a lean HTTP layer that kept every check would buy. An answer is written whole, head and
body in one write: enough for the fast path's answers, which give their length; a streamed answer
(SSE) is not framed, so only ``tools/call`` is measured through it.

One task per request; the answers of one connection are written in the order of its requests.

    .venv/bin/python benchmarks/core.py --config haltwire.toml --port 8123 [--edge]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, MutableMapping
from contextlib import AsyncExitStack
from http import HTTPStatus
from pathlib import Path
from typing import Any, cast

import anyio
import httptools

from haltwire import jsonwire
from haltwire.gateway import GatewayApp, create_app
from haltwire.gateway.config import load_config
from haltwire.gateway.wire import jsonrpc_result
from haltwire.identity import bearer_token
from haltwire.listener import ON_DISCONNECT
from haltwire.refusal import Refusal
from haltwire.serve import fast_loop

_HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


class _Parsed(asyncio.Protocol):
    """A connection whose bytes go to httptools' request parser, which calls the subclass back."""

    def __init__(self, app: GatewayApp) -> None:
        self._app = app
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._body: list[bytes] = []
        #: The answer written last, awaited before the next one is written (requests in order).
        self._last: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not registered as one)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)


class _Connection(_Parsed):
    def __init__(self, app: GatewayApp) -> None:
        super().__init__(app)
        self._token = b""

    def on_message_begin(self) -> None:
        self._token, self._body = b"", []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self._token = value

    def on_message_complete(self) -> None:
        loop = asyncio.get_running_loop()
        self._last = loop.create_task(self._answer(self._last, self._token, b"".join(self._body)))

    async def _answer(self, before: asyncio.Task[None] | None, token: bytes, body: bytes) -> None:
        status, reason, payload = await self._served(token, body)
        if before is not None:
            await before
        assert self._transport is not None
        self._transport.write(_HEAD % (status, reason, len(payload)) + payload)

    async def _served(self, authorization: bytes, body: bytes) -> tuple[int, bytes, bytes]:
        app = self._app
        token = bearer_token(authorization.decode("latin-1"))
        resolved = await app.identities.resolve(token) if token is not None else None
        if resolved is None or isinstance(resolved, Refusal):
            return 401, b"Unauthorized", b'{"error":"unauthenticated"}'
        identity, credential = resolved
        try:
            message = jsonwire.loads(body)
            params: dict[str, Any] = message["params"]
            request_id = message["id"]
            meta = params.get("_meta")
            result = await app.gateway.call_tool(
                identity,
                params["name"],
                params.get("arguments"),
                meta if isinstance(meta, dict) else None,
                credential=credential,
                request=(request_id, None),
            )
        except Exception as exc:  # a measuring stick: a bad request is answered, not served
            return 400, b"Bad Request", jsonwire.dumps({"error": repr(exc)})
        wire = result.tool_result() if isinstance(result, Refusal) else result
        return 200, b"OK", jsonrpc_result(request_id, app._stamp(wire))


class _EdgeConnection(_Parsed):
    """``--edge``: each request goes to the whole ``GatewayApp``, as uvicorn would hand it over."""

    def __init__(self, app: GatewayApp) -> None:
        super().__init__(app)
        self._url, self._headers = b"", list[tuple[bytes, bytes]]()
        #: Called when the connection is lost: the disconnect watches of requests not yet answered.
        self._on_lost: dict[int, Callable[[], None]] = {}
        self._closed = asyncio.Event()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed.set()
        lost, self._on_lost = self._on_lost, {}
        for callback in lost.values():
            callback()

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value.rstrip(b" \t")))

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self._url)
        scope: dict[str, Any] = {
            "type": "http",
            "http_version": "1.1",
            "method": self._parser.get_method().decode("ascii"),
            "path": url.path.decode("ascii"),
            "raw_path": url.path,
            "query_string": url.query or b"",
            "headers": self._headers,
        }
        loop = asyncio.get_running_loop()
        self._last = loop.create_task(self._run(self._last, scope, b"".join(self._body)))

    async def _run(self, before: asyncio.Task[None] | None, scope: dict[str, Any], body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        key, head = id(scope), list[bytes]()

        def on_disconnect(callback: Callable[[], None]) -> Callable[[], None]:
            if self._closed.is_set():  # gone before it asked: told now, never again
                callback()
                return forget
            self._on_lost[key] = callback
            return forget

        def forget() -> None:
            self._on_lost.pop(key, None)

        scope["extensions"] = {ON_DISCONNECT: on_disconnect}
        read = False

        async def receive() -> dict[str, Any]:
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self._closed.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                head.append(b"HTTP/1.1 %d %s\r\n" % (message["status"], HTTPStatus(message["status"]).phrase.encode()))
                head.extend(b"%s: %s\r\n" % (k, v) for k, v in message.get("headers", ()))
                head.append(b"\r\n")
                return
            if before is not None and not before.done():
                await before  # the answers of one connection, in the order of its requests
            transport.write(b"".join([*head, message.get("body", b"")]))
            head.clear()

        try:
            await self._app(scope, receive, send)
        finally:
            forget()


async def serve_core(config: Path, host: str, port: int, edge: bool = False) -> None:
    """Serve the pipeline of the gateway ``config`` describes on ``host:port`` until cancelled
    (``edge``: the whole app)."""
    app = create_app(load_config(config))
    protocol = _EdgeConnection if edge else _Connection
    async with AsyncExitStack() as stack:
        await app.start(stack)
        server = await asyncio.get_running_loop().create_server(lambda: protocol(app), host, port)
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--edge", action="store_true", help="serve the whole app, every edge check included")
    opts = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve_core, opts.config, opts.host, opts.port, opts.edge, backend_options=fast_loop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
