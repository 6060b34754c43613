"""The floor of a Python MCP gateway, for ``benchmarks/gateway.py``'s "floor" row.

What every gateway written in Python must do per call, and nothing else: on uvloop with
httptools' parsers (both C), read the client's request, parse its JSON (a gateway that checks a
call must read it), forward its bytes over a kept-alive upstream connection, parse the answer's
JSON (a gateway that judges results must read them) and write the upstream's bytes back. No
ASGI server, no task or coroutine per call (callbacks only), no checks, no counting, no
rewriting. A Python gateway can be no cheaper than this on the same machine, so its ratio to
direct is the least that any Python gateway's ratio can be.

Requests on one client connection are answered in order, over one upstream connection of that
client connection's own, opened anew once idle for ``KEEPALIVE_S`` (before the upstream drops it:
a POST is never sent twice); an upstream connection lost during a call closes the client's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools
import orjson

from haltwire.upstreams.sessions import KEEPALIVE_S

Headers = list[tuple[bytes, bytes]]

#: Hop-by-hop headers and the ones rewritten here; the rest are passed on as they came.
_DROPPED = frozenset({b"host", b"connection", b"content-length", b"transfer-encoding", b"keep-alive"})


def _parse_json(body: bytes, content_type: bytes) -> None:
    """Read the message as a gateway must: JSON, or the data lines of a server-sent-event stream."""
    if content_type.startswith(b"text/event-stream"):
        for line in body.split(b"\n"):
            if line.startswith(b"data:"):
                orjson.loads(line[5:])
    elif body:
        orjson.loads(body)


def _message(head: bytes, headers: Headers, body: bytes) -> bytes:
    lines = [head, *(k + b": " + v for k, v in headers), b"content-length: %d" % len(body), b"", body]
    return b"\r\n".join(lines)


class _Reader(asyncio.Protocol):
    """A message's headers (but the hop-by-hop ones) and body, as httptools' parser calls back."""

    def __init__(self) -> None:
        self._headers: Headers = []
        self._body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in _DROPPED:
            self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def _taken(self) -> tuple[Headers, bytes]:
        """The whole message read; the next one starts empty."""
        headers, body = self._headers, b"".join(self._body)
        self._headers, self._body = [], []
        return headers, body


class _Upstream(_Reader):
    """One kept-alive connection to the upstream; ``done`` is called with each whole answer."""

    def __init__(
        self, done: Callable[[int, Headers, bytes], None], lost: Callable[[_Upstream], None]
    ) -> None:
        super().__init__()
        self._done, self._lost = done, lost
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(self)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        self._done(self._parser.get_status_code(), *self._taken())


class _Client(_Reader):
    """A client connection: each request forwarded once the one before it is answered."""

    def __init__(self, host: str, port: int, path: bytes) -> None:
        super().__init__()
        self._host, self._port, self._path = host, port, path
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[bytes] = deque()
        self._busy = False
        self._upstream: _Upstream | None = None
        self._idle_since = 0.0
        self._connecting: asyncio.Task[None] | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._upstream is not None and self._upstream.transport is not None:
            self._upstream.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_message_complete(self) -> None:
        headers, body = self._taken()
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        _parse_json(body, content_type)
        method = self._parser.get_method()
        host = b"host: %s:%d" % (self._host.encode(), self._port)
        self._queue.append(_message(method + b" " + self._path + b" HTTP/1.1\r\n" + host, headers, body))
        self._next()

    def _next(self) -> None:
        if self._busy or not self._queue:
            return
        self._busy = True
        request = self._queue.popleft()
        loop = asyncio.get_running_loop()
        upstream = self._upstream
        if upstream is not None and upstream.transport is not None and loop.time() - self._idle_since < KEEPALIVE_S:
            upstream.transport.write(request)
            return
        if upstream is not None and upstream.transport is not None:
            self._upstream = None
            upstream.transport.close()
        self._connecting = loop.create_task(self._connect(request))  # owned by this connection

    async def _connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, self._upstream = await loop.create_connection(
                lambda: _Upstream(self._answered, self._upstream_lost), self._host, self._port
            )
        except OSError:
            assert self._transport is not None
            self._transport.close()  # the upstream cannot be reached: nor can this gateway
            return
        assert self._upstream.transport is not None
        self._upstream.transport.write(request)

    def _answered(self, status: int, headers: Headers, body: bytes) -> None:
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        _parse_json(body, content_type)
        assert self._transport is not None
        self._transport.write(_message(b"HTTP/1.1 %d OK" % status, headers, body))
        self._busy = False
        self._idle_since = asyncio.get_running_loop().time()
        self._next()

    def _upstream_lost(self, upstream: _Upstream) -> None:
        if upstream is not self._upstream:
            return  # one this connection let go of
        self._upstream = None
        if self._busy and self._transport is not None:
            self._transport.close()  # its call is lost with it, and is not sent again


async def serve_floor(upstream: str, host: str, port: int) -> None:
    """Serve the floor on ``host:port`` in front of ``upstream`` (an http:// URL) until cancelled."""
    url = urlsplit(upstream)
    assert url.hostname is not None and url.port is not None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(url.hostname or "", url.port or 80, (url.path or "/").encode()), host, port
    )
    async with server:
        await server.serve_forever()
