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

One task per request; the answers of one connection are written in the order of its requests.

    .venv/bin/python benchmarks/core.py --config haltwire.toml --port 8123
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import anyio
import httptools

from haltwire import jsonwire
from haltwire.gateway import GatewayApp, create_app
from haltwire.gateway.config import load_config
from haltwire.gateway.wire import jsonrpc_result
from haltwire.identity import bearer_token
from haltwire.refusal import Refusal
from haltwire.serve import fast_loop

_HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


class _Connection(asyncio.Protocol):
    def __init__(self, app: GatewayApp) -> None:
        self._app = app
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._token = b""
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

    def on_message_begin(self) -> None:
        self._token, self._body = b"", []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self._token = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

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


async def serve_core(config: Path, host: str, port: int) -> None:
    """Serve the pipeline of the gateway ``config`` describes on ``host:port`` until cancelled."""
    app = create_app(load_config(config))
    async with AsyncExitStack() as stack:
        await app.start(stack)
        server = await asyncio.get_running_loop().create_server(lambda: _Connection(app), host, port)
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve_core, opts.config, opts.host, opts.port, backend_options=fast_loop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
