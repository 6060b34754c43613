"""What one listening socket accepts, so that a flood on it cannot starve the process.

uvicorn times out neither a connection that never finishes its request head (a slowloris) nor
counts connections per socket; with a file-descriptor limit of 1,024, enough half-open
connections to one port stop every other port of the process from accepting. ``Listener``
guards one socket, in this order:

1. past ``max_connections`` open connections, a new one is closed as it is accepted;
2. a connection that has not sent a whole request head within ``header_timeout_s`` (of its
   opening, or of its last answer) is closed; a request being answered is never cut;
3. a kept-alive connection idle for ``idle_timeout_s`` is closed (uvicorn's keep-alive timeout);
4. (the control plane's listeners) past ``max_in_flight`` requests being answered at once, a
   request is answered 503 at once, ``retryable`` with ``Retry-After``; streams (the watch) are
   bounded by the connection cap instead, since each is in flight for as long as it is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final

import h11
from pydantic import Field
from uvicorn.protocols.http.h11_impl import H11Protocol

from haltwire.config import ConfigError, ConfigModel

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class ListenerLimits(ConfigModel):
    """One listener's limits (``[control.agent_listener]``, ``[control.admin_listener]``,
    ``[gateway.listener]``)."""

    max_connections: int = Field(default=1024, ge=1)
    header_timeout_s: float = Field(default=5.0, gt=0)
    idle_timeout_s: float = Field(default=30.0, gt=0)
    max_in_flight: int = Field(default=256, ge=1)


#: Descriptors a process needs beside its listeners' connections (stores, upstreams, logs).
SPARE_DESCRIPTORS: Final = 128


def check_descriptors(listeners: Sequence[ListenerLimits], pool: int = 0) -> int:
    """Raise the soft open-file limit to the hard one, then ``ConfigError`` unless every
    listener's ``max_connections`` (and a connection pool of ``pool``, the gateway's to Redis)
    fits in it with room to spare; answers the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    held = sum(limits.max_connections for limits in listeners) + pool
    if soft != resource.RLIM_INFINITY and held + SPARE_DESCRIPTORS > soft:
        pooled = f" (and {pool} to Redis)" if pool else ""
        raise ConfigError(
            f"max_connections: the listeners may hold {held - pool} connections{pooled}, but this "
            f"process may open only {soft} files ({SPARE_DESCRIPTORS} are kept for everything else); "
            "lower max_connections or raise the limit (ulimit -n)"
        )
    return soft


def guarded_protocol(limits: ListenerLimits) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with steps 1 and 2 of the module's docstring."""

    class Guarded(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.abort()  # no answer: answering would cost what the cap protects
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._head_overdue)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _head_overdue(self) -> None:
            # Still waiting for a request's head (h11: the client has not left IDLE).
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return Guarded


class InFlightCap:
    """Step 4 of the module's docstring, as ASGI middleware around one listener's app;
    ``streams`` are the paths exempt from it."""

    def __init__(self, app: App, limit: int, streams: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.limit = limit
        self.streams = streams
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.streams:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await _busy(send, self.limit)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _busy(send: Send, limit: int) -> None:
    error = {
        "code": "busy",
        "message": f"this listener is answering {limit} requests, the most it takes at once; wait 1 s",
        "retryable": True,
        "retry_after_s": 1,
    }
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps({"error": error}).encode()})
