"""Upstream MCP servers: connecting to them, listing their tools, forwarding calls.

Each upstream is one long-lived official MCP ``Client`` (a stdio command or a
streamable-HTTP URL), opened when the gateway starts: it negotiates the protocol and
lists the tools. The tools of all upstreams are exposed together, each under an optional
per-upstream prefix.

Calls to an HTTP upstream that negotiated a modern (2026-07-28, per-request envelope)
protocol take a lean path (``ModernHttpCaller``): one JSON-RPC POST per call over a
persistent connection, written and read as JSON. The SDK client's per-call machinery
(dispatcher, per-request task, pydantic models, output-schema validation that the caller's
own client repeats) and httpx's layers cost the gateway more than every check it makes
(``benchmarks/gateway.py`` measures it). Stdio upstreams and handshake-era HTTP upstreams
stay on the SDK client.
"""

from __future__ import annotations

import codecs
import itertools
import json
import logging
import os
import re
import select
import time
import urllib.request
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import httpx2
import mcp.types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    encode_header_value,
    mcp_param_headers,
    x_mcp_header_map,
)
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from haltwire import __version__
from haltwire.config import UpstreamConfig

log = logging.getLogger("haltwire.upstreams")

RECONNECT_MAX_S = 10.0

#: The upstream's own identity stamp; the gateway answers as itself, so it is stripped.
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
#: Reserved envelope keys the client sends per request; the upstream client adds its own.
_ENVELOPE_PREFIX = "io.modelcontextprotocol/"

Progress = ProgressFnT

#: Who the gateway says it is to its upstreams, on both paths.
CLIENT_INFO: Final = types.Implementation(name="haltwire", version=__version__)
#: HTTP timeouts towards an upstream; a call's own deadline bounds the wait for its answer.
HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=None)
#: Connections to one HTTP upstream at once, all kept open between calls.
HTTP_MAX_CONNECTIONS: Final = 256
HTTP_LIMITS: Final = httpx2.Limits(
    max_connections=HTTP_MAX_CONNECTIONS, max_keepalive_connections=HTTP_MAX_CONNECTIONS
)
#: How often a modern call's SSE stream is resumed (``Last-Event-ID``) before giving up.
SSE_RESUME_ATTEMPTS = 2


class UpstreamError(Exception):
    """An upstream did not start, or could not list its tools."""


class UpstreamUnavailable(Exception):
    """A call could not reach its upstream (connection refused, process gone)."""


@dataclass(frozen=True, slots=True)
class Route:
    upstream: Upstream
    tool: str
    """The tool's name at the upstream (without the gateway's prefix)."""


def forwarded_meta(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The client's ``_meta`` minus the per-request envelope and progress token."""
    if not meta:
        return None
    out = {k: v for k, v in meta.items() if not k.startswith(_ENVELOPE_PREFIX) and k != "progressToken"}
    return out or None


def strip_server_info(result: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("_meta")
    if isinstance(meta, dict) and SERVER_INFO_META in meta:
        rest = {k: v for k, v in meta.items() if k != SERVER_INFO_META}
        if rest:
            result["_meta"] = rest
        else:
            del result["_meta"]
    return result


class _Redirected(Exception):
    """The upstream answered a call with a redirect; the SDK client knows which ones to follow."""


class _ProtocolViolation(Exception):
    """The upstream's HTTP answer could not be read (bad framing, an oversized event, ...)."""


#: What a failed exchange with an upstream raises, on either HTTP path: all mean "unreachable".
_TRANSPORT_ERRORS: Final = (
    httpx2.TransportError,
    httpx2.StreamError,
    OSError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    anyio.DelimiterNotFound,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    _ProtocolViolation,
)


class ModernHttpCaller:
    """``tools/call`` on a modern streamable-HTTP upstream: one JSON-RPC POST, read as JSON.

    What the SDK client would send is sent: the ``_meta`` envelope (protocol version,
    client info and capabilities), the ``MCP-Protocol-Version``, ``Mcp-Method`` and
    ``Mcp-Name`` headers, and the ``Mcp-Param-*`` headers the tool's input schema asks for.
    The answer may be JSON or an SSE stream; on a stream, progress notifications for this
    call go to ``progress`` and the response ends it. Transport failures raise
    ``UpstreamUnavailable``; a JSON-RPC error raises ``MCPError`` with the upstream's code
    and message. Cancelling the call closes its HTTP request, which the upstream sees as
    the call's cancellation.

    The POST goes over ``_Http11`` (plain keep-alive HTTP/1.1, one write per request) for an
    ``http://`` URL that no proxy setting applies to, and over the httpx2 client otherwise
    (TLS, proxies). On loopback the first costs a quarter of the CPU of the second.
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        url: str,
        protocol_version: str,
        tools: list[types.Tool],
        *,
        name: str = "upstream",
        plain: bool | None = None,
    ) -> None:
        self._http = http
        self._url = httpx2.URL(url)
        self._name = name
        # The client's own headers (the config's, plus user-agent and the like) once, then
        # this protocol's; neither path merges them per request.
        headers = dict(http.headers)
        headers.update(
            {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                MCP_PROTOCOL_VERSION_HEADER: protocol_version,
                MCP_METHOD_HEADER: "tools/call",
            }
        )
        self._headers = headers
        self._envelope: dict[str, Any] = {
            PROTOCOL_VERSION_META_KEY: protocol_version,
            CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(mode="json", by_alias=True, exclude_none=True),
            # The gateway offers its upstreams no client features (sampling, roots, ...).
            CLIENT_CAPABILITIES_META_KEY: {},
        }
        self._param_headers = {t.name: m for t in tools if (m := x_mcp_header_map(t.input_schema))}
        self._extensions = {"timeout": HTTP_TIMEOUT.as_dict()}
        self._ids = itertools.count(1)
        if plain is None:
            plain = _Http11.suits(self._url, headers)
        self._plain = _Http11(self._url) if plain else None

    @property
    def plain(self) -> bool:
        """Whether calls go over the plain HTTP/1.1 path (else over httpx2)."""
        return self._plain is not None

    async def aclose(self) -> None:
        if self._plain is not None:
            await self._plain.aclose()

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        request_id = next(self._ids)
        out_meta = forwarded_meta(meta) or {}
        out_meta.update(self._envelope)
        if progress is not None:
            out_meta["progressToken"] = request_id
        params: dict[str, Any] = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        params["_meta"] = out_meta
        body = json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params},
            separators=(",", ":"),
        ).encode()
        headers = dict(self._headers)
        headers[MCP_NAME_HEADER] = encode_header_value(tool)
        header_map = self._param_headers.get(tool)
        if header_map is not None and arguments:
            headers.update(mcp_param_headers(header_map, arguments))
        try:
            reply = await self._send("POST", headers, body)
            try:
                return await self._answer(reply, request_id, progress)
            finally:
                # Also when cancelled: closing an unfinished response closes its connection,
                # and that is how the upstream learns the call was cancelled.
                with anyio.CancelScope(shield=True):
                    await reply.aclose()
        except _TRANSPORT_ERRORS as exc:
            raise UpstreamUnavailable(f"{self._name}: {_describe(exc)}") from exc

    async def _send(self, method: str, headers: dict[str, str], body: bytes) -> _Reply:
        if self._plain is not None:
            return await self._plain.request(method, headers, body)
        request = httpx2.Request(
            method, self._url, headers=headers, content=body, extensions=self._extensions
        )
        return _HttpxReply(await self._http.send(request, stream=True, follow_redirects=False))

    async def _answer(self, reply: _Reply, request_id: int, progress: Progress | None) -> dict[str, Any]:
        status = reply.status
        content_type = reply.header("content-type").partition(";")[0].strip().lower()
        if status in (301, 302, 303, 307, 308) and reply.header("location"):
            raise _Redirected(reply.header("location"))
        if status >= 400:
            # A JSON-RPC error may come with a 4xx/5xx status: it is the answer.
            if content_type == "application/json":
                try:
                    error = _error_of(json.loads(await reply.read()))
                except (ValueError, RecursionError):
                    error = None
                if error is not None:
                    raise error
            if status in (502, 503, 504):  # a proxy in front of the upstream cannot reach it
                raise UpstreamUnavailable(f"{self._name}: HTTP {status}")
            if status == 404:
                raise MCPError(METHOD_NOT_FOUND, "Not Found")
            raise MCPError(INTERNAL_ERROR, "Server returned an error response")
        if status == 202:
            raise MCPError(INVALID_REQUEST, "server answered a request with 202 Accepted")
        if content_type == "application/json":
            try:
                message = json.loads(await reply.read())
            except (ValueError, RecursionError) as exc:
                raise MCPError(PARSE_ERROR, f"Failed to parse JSON response: {exc}") from exc
            return _settle(message, request_id)
        if content_type == "text/event-stream":
            return await self._stream(reply, request_id, progress)
        raise MCPError(INVALID_REQUEST, f"Unexpected content type: {content_type}")

    async def _stream(self, reply: _Reply, request_id: int, progress: Progress | None) -> dict[str, Any]:
        """Read an SSE answer; resume it with ``Last-Event-ID`` if it ends before the response."""
        events = _SSEDecoder(DEFAULT_MAX_SSE_EVENT_SIZE)
        answer = await _events(reply, events, request_id, progress)
        for _ in range(SSE_RESUME_ATTEMPTS):
            if answer is not None or not events.last_event_id:
                break
            await anyio.sleep((events.retry_ms if events.retry_ms is not None else 1000) / 1000)
            headers = {k: v for k, v in self._headers.items() if k not in (MCP_METHOD_HEADER, "content-type")}
            headers["accept"] = "text/event-stream"
            headers["last-event-id"] = events.last_event_id
            again = await self._send("GET", headers, b"")
            try:
                if again.status >= 400:
                    break
                events = _SSEDecoder(DEFAULT_MAX_SSE_EVENT_SIZE, last_event_id=events.last_event_id)
                answer = await _events(again, events, request_id, progress)
            finally:
                with anyio.CancelScope(shield=True):
                    await again.aclose()
        if answer is None:
            raise UpstreamUnavailable(f"{self._name}: the answer's stream ended without a response")
        return answer


async def _events(
    reply: _Reply, events: _SSEDecoder, request_id: int, progress: Progress | None
) -> dict[str, Any] | None:
    """The result carried by one SSE stream, or None if the stream ended first."""
    async with aclosing(reply.chunks()) as chunks:
        while True:
            chunk = await anext(chunks, None)
            for data in events.feed(b"" if chunk is None else chunk, final=chunk is None):
                try:
                    message = json.loads(data)
                except (ValueError, RecursionError) as exc:
                    raise MCPError(PARSE_ERROR, f"Failed to parse SSE message: {exc}") from exc
                if not isinstance(message, dict):
                    continue
                if "result" in message or "error" in message:
                    return _settle(message, request_id)
                if message.get("method") == "notifications/progress" and progress is not None:
                    await _report(message.get("params"), request_id, progress)
                # Anything else (log messages, ...) has no one to go to: not relayed.
            if chunk is None:
                return None


class _SSEDecoder:
    """Server-sent events (the WHATWG rules): bytes in, the data of each ``message`` event out."""

    def __init__(self, max_event_size: int, *, last_event_id: str = "") -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_size
        self.last_event_id = last_event_id
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes, *, final: bool = False) -> list[str]:
        """The data of the events ``chunk`` completes; ``final`` marks the end of the stream."""
        text = self._partial + self._text.decode(chunk, final)
        # A CR at the end may be the first half of a CRLF: keep it for the next chunk.
        held = text.endswith("\r") and not final
        if final and text.endswith("\r"):
            text += "\n"
        lines = _LINE_BREAK.split(text[:-1] if held else text)
        self._partial = lines.pop() + ("\r" if held else "")
        out: list[str] = []
        for line in lines:
            if not line:
                if self._data and self._event in ("", "message"):
                    out.append("\n".join(self._data))
                self._event, self._data, self._size = "", [], 0
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                self._size += len(value) + 1
                if self._size > self._max:
                    raise _ProtocolViolation(f"an SSE event is larger than {self._max} bytes")
                self._data.append(value)
            elif field == "event":
                self._event = value
            elif field == "id" and "\0" not in value:
                self.last_event_id = value
            elif field == "retry" and value.isdigit():
                self.retry_ms = int(value)
        if len(self._partial) > self._max:
            raise _ProtocolViolation(f"an SSE line is longer than {self._max} bytes")
        return out


_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")


class _Reply(Protocol):
    """An upstream's HTTP answer, as either HTTP path delivers it."""

    @property
    def status(self) -> int: ...

    def header(self, name: str) -> str: ...

    def chunks(self) -> AsyncGenerator[bytes, None]: ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _HttpxReply:
    __slots__ = ("_response",)

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status_code

    def header(self, name: str) -> str:
        return self._response.headers.get(name, "")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        async for chunk in self._response.aiter_bytes():
            yield chunk

    async def read(self) -> bytes:
        return await self._response.aread()

    async def aclose(self) -> None:
        await self._response.aclose()


class _Http11:
    """Plain HTTP/1.1 to one ``http://`` origin: keep-alive connections, one write per request.

    What the gateway needs of HTTP and no more: a request written in one piece, a response
    read by its framing (``Content-Length``, chunked, or up to the close), connections reused
    while the server keeps them alive. A connection is reused only when its last response
    was read to the end and it shows nothing to read (the server did not close it); one
    idle for ``KEEPALIVE_S`` is dropped first, as servers drop them after a few seconds.
    Nothing is ever retried: a POST that may have reached the upstream is never sent twice.
    """

    KEEPALIVE_S: Final = 4.0
    MAX_HEAD: Final = 65536

    def __init__(self, url: httpx2.URL) -> None:
        self._host = url.host
        self._port = url.port or 80
        self._start = f" {url.raw_path.decode('ascii')} HTTP/1.1\r\nhost: {url.netloc.decode('ascii')}\r\n"
        self._idle: list[_Connection] = []
        self._closed = False
        # As many connections at once as the httpx2 path allows; a call beyond waits for one.
        self._slots = anyio.Semaphore(HTTP_MAX_CONNECTIONS)

    @staticmethod
    def suits(url: httpx2.URL, headers: Mapping[str, str]) -> bool:
        """A plain-HTTP URL, no proxy set for it, and headers that can be written as they are."""
        if url.scheme != "http" or not url.host:
            return False
        proxies = urllib.request.getproxies()
        if ("http" in proxies or "all" in proxies) and not urllib.request.proxy_bypass(url.host):
            return False
        return not any(_UNSAFE_HEADER.search(f"{k}{v}") for k, v in headers.items())

    async def request(self, method: str, headers: Mapping[str, str], body: bytes) -> _PlainReply:
        lines = [method, self._start]
        for k, v in headers.items():
            if k not in _OWN_HEADERS:
                lines.append(f"{k}: {v}\r\n")
        lines.append(f"accept-encoding: identity\r\ncontent-length: {len(body)}\r\n\r\n")
        payload = "".join(lines).encode() + body
        await self._slots.acquire()
        conn: _Connection | None = None
        try:
            conn = await self._acquire()
            await conn.stream.send(payload)
            status, response_headers, keep_alive = await conn.head()
            return _PlainReply(self, conn, status, response_headers, keep_alive)
        except BaseException:
            await self.done(conn, reuse=False)
            raise

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self.KEEPALIVE_S and conn.quiet():
                return conn
            with anyio.CancelScope(shield=True):
                await conn.stream.aclose()
        with anyio.fail_after(HTTP_TIMEOUT.connect):
            stream = await anyio.connect_tcp(self._host, self._port)
        return _Connection(stream)

    async def done(self, conn: _Connection | None, *, reuse: bool) -> None:
        """A request is over: keep its connection for the next one, or close it."""
        self._slots.release()
        if conn is None:
            return
        if reuse and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
            return
        # Shielded: a cancelled call closes its connection on the way out.
        with anyio.CancelScope(shield=True):
            await conn.stream.aclose()

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their calls end."""
        self._closed = True
        idle, self._idle = self._idle, []
        # Shielded: this runs as the gateway shuts down, inside a cancelled scope.
        with anyio.CancelScope(shield=True):
            for conn in idle:
                await conn.stream.aclose()


#: Headers ``_Http11`` writes itself (the others pass through as given).
_OWN_HEADERS: Final = frozenset({"host", "content-length", "accept-encoding", "transfer-encoding"})
_UNSAFE_HEADER: Final = re.compile(r"[\r\n\0]")


class _Connection:
    __slots__ = ("buffer", "idle_since", "stream")

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffer = BufferedByteReceiveStream(stream)
        self.idle_since = 0.0

    def quiet(self) -> bool:
        """Open, and nothing to read: neither a close by the server nor stray bytes.

        anyio stops reading a socket between receives, so a close by the server waits in
        the kernel, where a poll sees it.
        """
        if self.buffer.buffer:
            return False
        fd = self.stream.extra(anyio.abc.SocketAttribute.raw_socket).fileno()
        if fd < 0:
            return False
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return not poller.poll(0)
        return not select.select([fd], [], [], 0)[0]

    async def head(self) -> tuple[int, dict[str, str], bool]:
        """The status, the headers (lower-case names) and whether the connection stays open."""
        while True:
            raw = await self.buffer.receive_until(b"\r\n\r\n", _Http11.MAX_HEAD)
            status_line, *header_lines = raw.decode("latin-1").split("\r\n")
            version, _, rest = status_line.partition(" ")
            if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
                raise _ProtocolViolation(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            status = int(rest[:3])
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue, 103 Early Hints); the real one follows
            headers: dict[str, str] = {}
            for line in header_lines:
                name, colon, value = line.partition(":")
                if not colon:
                    raise _ProtocolViolation(f"not an HTTP header: {line[:80]!r}")
                name, value = name.strip().lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            keep_alive = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
            return status, headers, keep_alive


class _PlainReply:
    """A response on an ``_Http11`` connection; closing it returns the connection or closes it."""

    __slots__ = ("_conn", "_done", "_framing", "_headers", "_keep_alive", "_left", "_pool", "status")

    def __init__(
        self, pool: _Http11, conn: _Connection, status: int, headers: dict[str, str], keep_alive: bool
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = status
        self._headers = headers
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise _ProtocolViolation("the upstream encoded its answer although asked not to")
        self._left = 0
        if status in (204, 304):
            self._framing = "none"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in headers:
            self._framing = "length"
            length = headers["content-length"]
            if not length.isdigit():
                raise _ProtocolViolation(f"not a Content-Length: {length[:40]!r}")
            self._left = int(length)
        else:
            self._framing = "close"
            keep_alive = False
        self._keep_alive = keep_alive
        self._done = self._framing == "none" or (self._framing == "length" and self._left == 0)

    def header(self, name: str) -> str:
        return self._headers.get(name, "")

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        conn = self._conn
        if conn is None or self._done:
            return
        buffer = conn.buffer
        if self._framing == "length":
            while self._left > 0:
                data = await buffer.receive(min(self._left, 65536))
                self._left -= len(data)
                yield data
        elif self._framing == "chunked":
            while True:
                size_line = await buffer.receive_until(b"\r\n", 1024)
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise _ProtocolViolation(f"not a chunk size: {size_line[:40]!r}")
                if size == 0:
                    while await buffer.receive_until(b"\r\n", _Http11.MAX_HEAD):
                        pass  # trailers
                    break
                while size > 0:
                    data = await buffer.receive(min(size, 65536))
                    size -= len(data)
                    yield data
                if await buffer.receive_exactly(2) != b"\r\n":
                    raise _ProtocolViolation("a chunk not followed by CRLF")
        else:
            while True:
                try:
                    data = await buffer.receive()
                except anyio.EndOfStream:
                    break
                yield data
        self._done = True

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.done(conn, reuse=self._done and self._keep_alive)


def _settle(message: Any, request_id: int) -> dict[str, Any]:
    """The result of a JSON-RPC response to ``request_id``, or its error raised as ``MCPError``."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise MCPError(PARSE_ERROR, "the upstream's answer is not a JSON-RPC message")
    error = _error_of(message)
    if error is not None:
        raise error
    if "error" in message:
        raise MCPError(PARSE_ERROR, "the upstream's error is not a JSON-RPC error")
    if message.get("id") != request_id:
        raise MCPError(INTERNAL_ERROR, "the upstream answered a different request")
    result = message.get("result")
    if not isinstance(result, dict):
        raise MCPError(PARSE_ERROR, "the upstream's response has no result object")
    return strip_server_info(result)


def _error_of(message: Any) -> MCPError | None:
    """A JSON-RPC error response as ``MCPError``; it may name no request (``id: null``)."""
    error = message.get("error") if isinstance(message, dict) else None
    if not isinstance(error, dict):
        return None
    code, text = error.get("code"), error.get("message")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(text, str):
        return None
    return MCPError(code, text, error.get("data"))


async def _report(params: Any, request_id: int, progress: Progress) -> None:
    """Pass on a progress notification for this call; a malformed one is dropped."""
    if not isinstance(params, dict) or params.get("progressToken") != request_id:
        return
    value, total, message = params.get("progress"), params.get("total"), params.get("message")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if total is not None and (isinstance(total, bool) or not isinstance(total, int | float)):
        return
    await progress(value, total, message if isinstance(message, str) else None)


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.name = config.name
        self._client: Client | None = None
        self._modern: ModernHttpCaller | None = None
        self.tools: list[types.Tool] = []

    async def _connect(self, stack: AsyncExitStack) -> Client:
        """Open the SDK client (and, for a URL, the HTTP client it and the lean path share)."""
        c = self.config
        target: Any
        http: httpx2.AsyncClient | None = None
        if c.url is not None:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=c.headers, timeout=HTTP_TIMEOUT, limits=HTTP_LIMITS)
            )
            target = streamable_http_client(c.url, http_client=http)
        else:
            assert c.command is not None
            target = StdioServerParameters(
                command=c.command[0], args=c.command[1:], env={**os.environ, **c.env}
            )
        client = await stack.enter_async_context(Client(target, cache=None, client_info=CLIENT_INFO))
        self._client = client
        self.tools = await self._list_all()
        if http is not None and c.url is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            modern = ModernHttpCaller(http, c.url, client.protocol_version, self.tools, name=self.name)
            stack.push_async_callback(modern.aclose)
            self._modern = modern
        return client

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the upstream's client for the gateway's lifetime (a task of ``Upstreams.connect``).

        Reports started once the tools are listed. If the connection dies later, calls to
        this upstream are refused as ``upstream_unavailable`` while this task reconnects,
        with a backoff of up to ``RECONNECT_MAX_S``; the gateway itself never crashes.
        (Calls on the lean HTTP path need no connection to be kept: each one that cannot
        reach the upstream is refused, and the next one tries again.)
        """
        delay = 0.5
        while True:
            try:
                async with AsyncExitStack() as stack:
                    await self._connect(stack)
                    if task_status is not anyio.TASK_STATUS_IGNORED:
                        task_status.started()
                        task_status = anyio.TASK_STATUS_IGNORED
                    delay = 0.5
                    await anyio.sleep_forever()
            except Exception as exc:
                if task_status is not anyio.TASK_STATUS_IGNORED:
                    raise  # never started: a start-up error for the caller
                log.error(
                    "upstream %s went away (%s); reconnecting in %.1f s", self.name, _describe(exc), delay
                )
            finally:
                self._client = None
                self._modern = None
            await anyio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        where = self.config.url or " ".join(self.config.command or [])
        try:
            with anyio.fail_after(self.config.connect_timeout_s):
                await tg.start(self.run)
        except Exception as exc:
            raise UpstreamError(f"upstream {self.name!r} ({where}) did not start: {_describe(exc)}") from exc

    async def _list_all(self) -> list[types.Tool]:
        assert self._client is not None
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        """Forward one call; the result in wire form, without the upstream's serverInfo stamp."""
        modern = self._modern
        if modern is not None:
            try:
                return await modern.call_tool(tool, arguments, meta, progress)
            except _Redirected as redirect:
                # Nothing ran: the upstream only pointed elsewhere. The SDK client follows
                # the redirects it deems safe (and reports the others); this upstream's
                # calls take that path from now on.
                log.warning(
                    "upstream %s redirects calls (to %s); configure that URL to skip a round trip",
                    self.name,
                    redirect,
                )
                if self._modern is modern:
                    self._modern = None
        client = self._client
        if client is None:
            raise UpstreamUnavailable(f"{self.name}: not connected")
        try:
            result = await client.session.call_tool(
                tool,
                arguments,
                progress_callback=progress,
                meta=forwarded_meta(meta),  # type: ignore[arg-type]
            )
        except (httpx2.TransportError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise UpstreamUnavailable(f"{self.name}: {_describe(exc)}") from exc
        except MCPError as exc:
            # The SDK fails pending requests this way when the transport dies under them.
            if exc.code == CONNECTION_CLOSED and exc.message == "Connection closed":
                raise UpstreamUnavailable(f"{self.name}: connection closed") from exc
            raise
        wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return strip_server_info(wire)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Upstreams:
    """Every upstream, and the exposed tool name -> route table."""

    def __init__(self, configs: list[UpstreamConfig]) -> None:
        self.upstreams = [Upstream(c) for c in configs]
        self._routes: dict[str, Route] = {}
        self._tools: list[types.Tool] = []
        self._schemas: dict[str, dict[str, Any]] = {}

    async def connect(self, stack: AsyncExitStack) -> None:
        """Start every upstream in a task group that ``stack`` owns and cancels on exit."""
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        for up in self.upstreams:
            await up.start(tg)
        self._build()

    def _build(self) -> None:
        routes: dict[str, Route] = {}
        tools: list[types.Tool] = []
        for up in self.upstreams:
            for tool in up.tools:
                exposed = up.config.prefix + tool.name
                if exposed in routes:
                    raise UpstreamError(
                        f"tool name {exposed!r} is offered by upstreams {routes[exposed].upstream.name!r} "
                        f"and {up.name!r}; give one of them a prefix"
                    )
                routes[exposed] = Route(up, tool.name)
                tools.append(tool.model_copy(update={"name": exposed}))
        self._routes = routes
        self._tools = tools
        self._schemas = {t.name: dict(t.input_schema) for t in tools}

    def route(self, exposed: str) -> Route | None:
        return self._routes.get(exposed)

    @property
    def tools(self) -> list[types.Tool]:
        return self._tools

    def input_schema(self, exposed: str) -> dict[str, Any] | None:
        return self._schemas.get(exposed)
