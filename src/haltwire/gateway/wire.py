"""The gateway edge's plumbing on the wire: a request body read within its limit (and handed on
to the SDK's handler as if unread), a call cancelled when its client disconnects, JSON-RPC
answers and their server-sent-event framing, and answers written whole (with their length)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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


async def until_disconnect(call: Awaitable[T], receive: Receive, http: Scope | None = None) -> T | None:
    """``call``'s answer, or None when the client disconnects first (``call`` is then cancelled
    through a cancel scope, so the upstream request is cancelled and the slot released exactly
    as a deadline would).

    Served by haltwire's listener (``http``'s ``ON_DISCONNECT`` extension), the connection's loss
    cancels it directly. Elsewhere one plain task watches the connection (no task group, no
    stream: this is every tool call's path); its owner is this function, which cancels it as
    soon as ``call`` ends, either way.
    """
    scope = anyio.CancelScope()
    on_disconnect = http.get("extensions", {}).get(ON_DISCONNECT) if http is not None else None
    if on_disconnect is not None:
        forget = on_disconnect(scope.cancel)
        try:
            with scope:
                return await call
            return None  # the client went away
        finally:
            forget()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        with scope:
            return await call
        return None  # cancelled by the watcher
    finally:
        watcher.cancel()


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
