"""The gateway edge's plumbing on the wire: a request body read within its limit (and handed on
to the SDK's handler as if unread), a call cancelled when its client disconnects, JSON-RPC
answers and their server-sent-event framing, and answers written whole (with their length)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
from starlette.types import Message, Receive, Scope, Send

from haltwire import jsonwire
from haltwire.listener import ON_DISCONNECT
from haltwire.refusal import Refusal

T = TypeVar("T")


JSON_HEADERS: Final = [(b"content-type", b"application/json")]


class BodyTooLarge(Exception):
    pass


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body; ``BodyTooLarge`` past ``limit`` bytes, cancelled if the client goes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise anyio.get_cancelled_exc_class()()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read body once, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def counted(receive: Receive, limit: int) -> Receive:
    """A ``receive`` that raises ``BodyTooLarge`` once the body is past ``limit`` bytes."""
    size = 0

    async def count() -> Message:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        if size > limit:
            raise BodyTooLarge
        return message

    return count


def is_tool_call(message: Any) -> bool:
    """One JSON-RPC request (not a batch, not a notification) whose method is ``tools/call``."""
    return isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message


def jsonrpc_result(request_id: Any, result: dict[str, Any]) -> bytes:
    return jsonwire.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def jsonrpc_error(request_id: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return jsonwire.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def sse_message(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: %s\r\n\r\n" % jsonwire.dumps(message)


class DisconnectWatch:
    """``with DisconnectWatch(http, receive, gone):``: ``gone()`` is called if the client
    disconnects while the block runs, before its answer is complete.

    Served by haltwire's listener (``http``'s ``ON_DISCONNECT`` extension), the listener calls it
    when the connection is lost, the request being answered behind pipelined ones included.
    Elsewhere one plain task awaits ``receive`` for the disconnect (no task group, no stream:
    this is every tool call's path); its owner is this watch, which cancels it as the block
    ends, either way. ``gone`` runs on the event loop and must not block.
    """

    def __init__(self, http: Scope | None, receive: Receive, gone: Callable[[], None]) -> None:
        self._http, self._receive, self._gone = http, receive, gone
        self._forget: Callable[[], None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> None:
        http = self._http
        on_disconnect = http.get("extensions", {}).get(ON_DISCONNECT) if http is not None else None
        if on_disconnect is not None:
            self._forget = on_disconnect(self._gone)
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def __exit__(self, *exc: object) -> None:
        if self._forget is not None:
            self._forget()
        if self._watcher is not None:
            self._watcher.cancel()

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._gone()


async def until_disconnect(call: Awaitable[T], receive: Receive, http: Scope | None = None) -> T | None:
    """``call``'s answer, or None when the client disconnects first (``DisconnectWatch``): ``call``
    is then cancelled through a cancel scope, so the upstream request is cancelled and the slot
    released exactly as a deadline would."""
    scope = anyio.CancelScope()
    with DisconnectWatch(http, receive, scope.cancel), scope:
        return await call
    return None  # the client went away


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    # With its length, not chunked: less to write, and less for the client to read and parse.
    sized = [*(headers or JSON_HEADERS), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": sized})
    await send({"type": "http.response.body", "body": body})


async def respond_refusal(send: Send, r: Refusal) -> None:
    headers = list(JSON_HEADERS)
    if r.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, round(r.retry_after_s))).encode()))
    if r.code == "unauthenticated":
        headers.append((b"www-authenticate", b'Bearer realm="haltwire"'))
    await respond(send, r.http_status, r.http_body(), headers)
