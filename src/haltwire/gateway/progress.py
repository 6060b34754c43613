"""A tool call whose client asked for progress: its notifications streamed as server-sent events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Scope, Send

from haltwire.gateway.wire import DisconnectWatch, sse_message
from haltwire.refusal import Refusal
from haltwire.upstreams.http import Progress

#: What a tool call comes to: the result in wire form, the refusal that replaces it, or a protocol error.
Outcome = dict[str, Any] | Refusal | MCPError

SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


async def with_progress(
    call: Callable[[Progress], Awaitable[Outcome]],
    token: Any,
    receive: Receive,
    send: Send,
    http: Scope | None = None,
) -> tuple[Outcome | None, bool]:
    """``call`` beside a stream of its progress notifications, sent as server-sent events as
    they come: its outcome (None when the client went away) and whether the SSE response started.

    The call runs in a task group that is cancelled when the client disconnects
    (``wire.DisconnectWatch``).
    """
    events_out, events_in = anyio.create_memory_object_stream[bytes](16)
    outcome: list[Outcome] = []

    async def report(progress: float, total: float | None, message: str | None) -> None:
        params: dict[str, Any] = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        await events_out.send(sse_message(note))

    async def run_call() -> None:
        async with events_out:
            outcome.append(await call(report))

    committed_sse = False
    async with events_in, anyio.create_task_group() as tg:
        with DisconnectWatch(http, receive, tg.cancel_scope.cancel):
            tg.start_soon(run_call)
            async for event in events_in:
                if not committed_sse:
                    committed_sse = True
                    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                await send({"type": "http.response.body", "body": event, "more_body": True})
        tg.cancel_scope.cancel()
    return (outcome[0] if outcome else None), committed_sse
