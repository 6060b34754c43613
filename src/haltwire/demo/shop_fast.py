"""The shop's lean route for its one destructive tool: ``tools/call`` of ``issue_refund`` answered
without the SDK's per-request machinery.

The shop is the upstream of ``benchmarks/executor.py``, where the SDK's stateless handling of
each call (a task group, pydantic models in and out) cost the shop more CPU than the control
plane spent on the same intent. ``FastRoute`` answers a well-formed modern (2026-07-28) POST of
the tool itself, as the SDK answers it (the same result, ``resultType`` and server stamp); any
request it does not recognise as such (another method or tool, a handshake-era client, a
header or envelope out of the ordinary, a body that is not JSON) goes to the SDK's app with
its body replayed, so every answer but the successful one stays the SDK's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types import SERVER_INFO_META_KEY as SERVER_INFO
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from haltwire import jsonwire

#: The tool's answer: its text, and its structured record (None: an error result).
Answer = tuple[str, dict[str, Any] | None]
#: The tool itself: ``(meta, arguments) -> Answer``.
Tool = Callable[[dict[str, Any], dict[str, Any]], Awaitable[Answer]]

#: The routing headers a modern call carries once each, and the body most calls stay under.
_ROUTING: Final = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")
_MAX_BODY: Final = 64 << 10


class FastRoute:
    """ASGI: ``POST /mcp`` calls of ``tool`` answered by ``call``; everything else by ``app``."""

    def __init__(self, app: ASGIApp, tool: str, call: Tool, server_name: str) -> None:
        self.app = app
        self.tool = tool
        self._name = tool.encode()
        self.call = call
        self._stamp = {SERVER_INFO: {"name": server_name, "version": ""}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/mcp"):
            await self.app(scope, receive, send)
            return
        version = self._routed(scope["headers"])
        if version is None:
            await self.app(scope, receive, send)
            return
        body, complete, pending = await _body(receive)
        # A caller gone, a body past the usual size, or not a plain call: the SDK's to answer.
        asked = self._asked(body, version) if complete else None
        if asked is None:
            await self.app(scope, _replayed(body, complete, pending, receive), send)
            return
        request_id, meta, arguments = asked
        text, record = await self.call(meta, arguments)
        result: dict[str, Any] = {"content": [{"text": text, "type": "text"}], "isError": record is None}
        result["resultType"] = "complete"
        if record is not None:
            result["structuredContent"] = record
        result["_meta"] = self._stamp
        answer = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, separators=(",", ":"))
        data = answer.encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    def _routed(self, raw: list[tuple[bytes, bytes]]) -> str | None:
        """The protocol version of a call of the tool with ordinary headers, else None."""
        seen: dict[bytes, bytes] = {}
        for name, value in raw:
            if name in seen and name in _ROUTING:
                return None  # a duplicated routing header: the SDK's rejection
            seen[name] = value
        accept = seen.get(b"accept", b"")
        if (
            seen.get(b"mcp-method") != b"tools/call"
            or seen.get(b"mcp-name") != self._name
            or seen.get(b"content-type", b"").split(b";")[0].strip() != b"application/json"
            or b"application/json" not in accept
            or b"text/event-stream" not in accept
        ):
            return None
        version = seen.get(b"mcp-protocol-version", b"").decode("latin-1")
        return version if version in MODERN_PROTOCOL_VERSIONS else None

    def _asked(self, body: bytes, version: str) -> tuple[int | str, dict[str, Any], dict[str, Any]] | None:
        """The request's id, ``_meta`` and arguments when it is a plain call of the tool."""
        try:
            message = jsonwire.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(message, dict) or message.keys() != {"jsonrpc", "id", "method", "params"}:
            return None
        request_id, params = message["id"], message["params"]
        if (
            message["jsonrpc"] != "2.0"
            or message["method"] != "tools/call"
            or isinstance(request_id, bool)
            or not isinstance(request_id, int | str)
            or not isinstance(params, dict)
            or params.get("name") != self.tool
            or not params.keys() <= {"name", "arguments", "_meta"}
        ):
            return None
        meta, arguments = params.get("_meta"), params.get("arguments", {})
        if (
            not isinstance(meta, dict)
            or not isinstance(arguments, dict)
            or meta.get(PROTOCOL_VERSION_META_KEY) != version
            or not isinstance(meta.get(CLIENT_INFO_META_KEY), dict)
            or not isinstance(meta.get(CLIENT_CAPABILITIES_META_KEY), dict)
        ):
            return None
        return request_id, meta, arguments


async def _body(receive: Receive) -> tuple[bytes, bool, Message | None]:
    """What was read of the body, whether it is all of it, and the message that ended the
    reading early (a disconnect), if one did; a body past ``_MAX_BODY`` is left unfinished."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False, message
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True, None
        if size > _MAX_BODY:
            return b"".join(chunks), False, None


def _replayed(body: bytes, complete: bool, pending: Message | None, receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the body read so far, then what ended the
    reading (if anything did), then the rest from ``receive``."""
    replay: list[Message] = [{"type": "http.request", "body": body, "more_body": not complete}]
    if pending is not None:
        replay.append(pending)

    async def replaying() -> Message:
        return replay.pop(0) if replay else await receive()

    return replaying
