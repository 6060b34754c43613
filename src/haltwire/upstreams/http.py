"""The lean path for ``tools/call`` to a modern (2026-07-28) streamable-HTTP upstream.

One JSON-RPC POST per call over kept-alive connections, written and read as JSON: the SDK
client's per-call machinery (dispatcher, per-request task, pydantic models, output-schema
validation the caller's own client repeats) costs more than every check the gateway makes
(``benchmarks/gateway.py``). Also what both paths to an upstream share.
"""

from __future__ import annotations

import codecs
import itertools
import re
from collections.abc import Mapping
from typing import Any, Final, Protocol

import aiohttp
import anyio
import mcp.types as types
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE
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
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION_META_KEY,
)
from yarl import URL

from haltwire import __version__, jsonwire
from haltwire.errors import describe
from haltwire.upstreams import h1
from haltwire.upstreams.sessions import client_session, env_proxy

Progress = ProgressFnT

#: The upstream's own identity stamp; the gateway answers as itself, so it is stripped.
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
#: Reserved envelope keys the client sends per request; the upstream client adds its own.
_ENVELOPE_PREFIX = "io.modelcontextprotocol/"

#: Who the gateway says it is to its upstreams, on both paths.
CLIENT_INFO: Final = types.Implementation(name="haltwire", version=__version__)
USER_AGENT: Final = f"haltwire/{__version__}"

#: Connections to one HTTP upstream at once, all kept open between calls.
HTTP_MAX_CONNECTIONS: Final = 256
#: Opening a connection (or waiting for one of the pool); a call's own deadline bounds the rest.
HTTP_CONNECT_TIMEOUT_S: Final = 30.0


class UpstreamUnavailable(Exception):
    """A call could not reach its upstream (connection refused, process gone)."""


class Redirected(Exception):
    """The upstream answered a call with a redirect; the SDK client knows which ones to follow."""


class _ProtocolViolation(Exception):
    """The upstream's HTTP answer could not be read (an oversized event, ...)."""


#: What a failed exchange raises, all meaning "unreachable" (``asyncio.TimeoutError`` is an OSError).
_TRANSPORT_ERRORS: Final = (aiohttp.ClientError, OSError, _ProtocolViolation)


class _Chunks(Protocol):
    async def readany(self) -> bytes: ...


class _Response(Protocol):
    """What an answer is read through: aiohttp's response, or ``h1.Answer``."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> _Chunks: ...
    async def read(self) -> bytes: ...
    def release(self) -> Any: ...
    def close(self) -> None: ...


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


class ModernHttpCaller:
    """``tools/call`` on a modern streamable-HTTP upstream, sent as the SDK client would send it.

    The answer may be JSON or an SSE stream (progress for this call goes to ``progress``; a
    stream that ends before the response is ``UpstreamUnavailable``, as is a transport
    failure). A JSON-RPC error raises ``MCPError`` with the upstream's code, message and data;
    a redirect raises ``Redirected``. Cancelling a call closes its connection, which the
    upstream sees as the call's cancellation. Nothing is retried. Create it in the event loop
    that uses it; ``aclose`` closes its connections.

    An ``http://`` upstream reached directly takes ``h1.Pool`` (a request in one write, the
    answer parsed in C); ``https://``, a proxy, or a configured header that is not plain
    Latin-1 take aiohttp.
    """

    def __init__(
        self,
        url: str,
        protocol_version: str,
        tools: list[types.Tool],
        *,
        headers: Mapping[str, str] | None = None,
        name: str = "upstream",
    ) -> None:
        self._url = URL(url)
        self._name = name
        self._closed = False
        self._proxy, self._proxy_auth = env_proxy(self._url)
        own = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            MCP_PROTOCOL_VERSION_HEADER: protocol_version,
            MCP_METHOD_HEADER: "tools/call",
        }
        # The configured headers, then this protocol's (which win): merged once, not per call.
        lower = {k.lower() for k in own}
        self._headers = {k: v for k, v in (headers or {}).items() if k.lower() not in lower}
        self._headers.update(own)
        self._lean: h1.Pool | None = None
        self._session: aiohttp.ClientSession | None = None
        if self._url.scheme == "http" and self._proxy is None and h1.encodable(self._headers):
            self._lean = h1.Pool(
                self._url,
                limit=HTTP_MAX_CONNECTIONS,
                connect_timeout_s=HTTP_CONNECT_TIMEOUT_S,
                headers=self._headers,
                user_agent=USER_AGENT,
            )
        else:
            self._session = client_session(
                limit=HTTP_MAX_CONNECTIONS,
                connect_timeout_s=HTTP_CONNECT_TIMEOUT_S,
                headers={"user-agent": USER_AGENT},
            )
        self._envelope: dict[str, Any] = {
            PROTOCOL_VERSION_META_KEY: protocol_version,
            CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(mode="json", by_alias=True, exclude_none=True),
            # The gateway offers its upstreams no client features (sampling, roots, ...).
            CLIENT_CAPABILITIES_META_KEY: {},
        }
        self._param_headers = {t.name: m for t in tools if (m := x_mcp_header_map(t.input_schema))}
        self._ids = itertools.count(1)

    async def aclose(self) -> None:
        self._closed = True
        if self._lean is not None:
            self._lean.close()
        if self._session is not None:
            # Shielded: this runs as the gateway shuts down, inside a cancelled scope.
            with anyio.CancelScope(shield=True):
                await self._session.close()

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        if self._closed:  # the upstream is reconnecting; its next caller is not
            raise UpstreamUnavailable(f"{self._name}: not connected")
        request_id = next(self._ids)
        out_meta = forwarded_meta(meta) or {}
        out_meta.update(self._envelope)
        if progress is not None:
            out_meta["progressToken"] = request_id
        params: dict[str, Any] = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        params["_meta"] = out_meta
        body = jsonwire.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
        headers = {MCP_NAME_HEADER: encode_header_value(tool)}
        header_map = self._param_headers.get(tool)
        if header_map is not None and arguments:
            headers.update(mcp_param_headers(header_map, arguments))
        try:
            # A cancellation before the answer's head arrives closes the connection.
            response: _Response
            if self._lean is not None:
                response = await self._lean.post(headers, body)
            else:
                assert self._session is not None
                response = await self._session.post(
                    self._url,
                    data=body,
                    headers={**self._headers, **headers},
                    allow_redirects=False,
                    proxy=self._proxy,
                    proxy_auth=self._proxy_auth,
                )
            try:
                answer = await self._answer(response, request_id, progress)
            except Exception:
                response.release()  # the connection is kept only if the answer was read to its end
                raise
            except BaseException:
                # Cancelled: drop the connection; that is how the upstream learns of it.
                response.close()
                raise
            response.release()
            return answer
        except _TRANSPORT_ERRORS as exc:
            raise UpstreamUnavailable(f"{self._name}: {describe(exc)}") from exc

    async def _answer(
        self, response: _Response, request_id: int, progress: Progress | None
    ) -> dict[str, Any]:
        status = response.status
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        location = response.headers.get("location")
        if status in (301, 302, 303, 307, 308) and location:
            raise Redirected(location)
        if status >= 400:
            # A JSON-RPC error may come with a 4xx/5xx status: it is the answer.
            if content_type == "application/json":
                try:
                    error = _error_of(jsonwire.loads(await response.read()))
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
                message = jsonwire.loads(await response.read())
            except (ValueError, RecursionError) as exc:
                raise MCPError(PARSE_ERROR, f"Failed to parse JSON response: {exc}") from exc
            return _settle(message, request_id)
        if content_type == "text/event-stream":
            return await self._stream(response, request_id, progress)
        raise MCPError(INVALID_REQUEST, f"Unexpected content type: {content_type}")

    async def _stream(
        self, response: _Response, request_id: int, progress: Progress | None
    ) -> dict[str, Any]:
        events = _SSEDecoder(DEFAULT_MAX_SSE_EVENT_SIZE)
        while True:
            chunk = await response.content.readany()
            for data in events.feed(chunk, final=not chunk):
                try:
                    message = jsonwire.loads(data)
                except (ValueError, RecursionError) as exc:
                    raise MCPError(PARSE_ERROR, f"Failed to parse SSE message: {exc}") from exc
                if not isinstance(message, dict):
                    continue
                if "result" in message or "error" in message:
                    return _settle(message, request_id)
                if message.get("method") == "notifications/progress" and progress is not None:
                    await _report(message.get("params"), request_id, progress)
                # Anything else (log messages, ...) has no one to go to: not relayed.
            if not chunk:
                raise UpstreamUnavailable(f"{self._name}: the answer's stream ended without a response")


class _SSEDecoder:
    """Server-sent events (the WHATWG rules): bytes in, the data of each ``message`` event out."""

    def __init__(self, max_event_size: int) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_size

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
            # ``id`` and ``retry`` serve resuming a stream, which this path does not do.
        if len(self._partial) > self._max:
            raise _ProtocolViolation(f"an SSE line is longer than {self._max} bytes")
        return out


_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")


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
