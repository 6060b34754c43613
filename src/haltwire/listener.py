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
   bounded by the connection cap instead, since each is in flight for as long as it is open;
5. (httptools) a request can ask to be told when its client disconnects (``ON_DISCONNECT``),
   so a call is cancelled then without a task per request awaiting ``receive``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import resource
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final, Literal, cast

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


Parser = Literal["auto", "httptools", "h11"]

#: The scope extension by which a request of the httptools listener asks to be told, without a
#: task awaiting ``receive``, that its client went away before its answer was complete:
#: ``forget = scope["extensions"][ON_DISCONNECT](callback)``; ``callback`` is called at once
#: if the client has already gone. ``forget()`` once the answer is written.
ON_DISCONNECT: Final = "haltwire.on_disconnect"
OnDisconnect = Callable[[Callable[[], None]], Callable[[], None]]


def guarded_protocol(limits: ListenerLimits, parser: Parser = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol with steps 1 and 2 of the module's docstring: on httptools'
    parser when it is installed (``auto``; a C parser, a fraction of h11's cost per request),
    else on h11's."""
    if parser == "httptools" or (parser == "auto" and importlib.util.find_spec("httptools") is not None):
        return _on_httptools(limits)
    return _on_h11(limits)


#: How early a timer may fire (uvloop's clock and timers count whole milliseconds).
_TIMER_SLACK_S: Final = 0.002


class _HeadDeadline:
    """Step 2 for one connection: closed unless a whole request head comes within
    ``header_timeout_s`` of its opening or of its last answer; ``waiting`` says whether the
    connection is still waiting for one (a request being answered is never cut).

    Re-arming only moves the due time: the one pending timer, when it fires early, is set again
    for it. An answer then costs no new timer (a kept-alive connection re-arms on every answer).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limits: ListenerLimits, transport: asyncio.Transport
    ) -> None:
        self._loop, self._timeout_s, self._transport = loop, limits.header_timeout_s, transport
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.waiting: Callable[[], bool] = lambda: True

    def arm(self) -> None:
        self._due = self._loop.time() + self._timeout_s
        if self._timer is None:
            self._timer = self._loop.call_at(self._due, self._overdue)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _overdue(self) -> None:
        self._timer = None
        if not self.waiting():
            return  # being answered: the answer arms it again
        if self._due - self._loop.time() > _TIMER_SLACK_S:  # re-armed since this timer was set
            self._timer = self._loop.call_at(self._due, self._overdue)
        elif not self._transport.is_closing():
            self._transport.close()


def _accepted(connections: set[Any], limits: ListenerLimits, transport: asyncio.Transport) -> bool:
    """Step 1: past ``max_connections``, the connection is aborted as it is accepted (no answer:
    answering would cost what the cap protects)."""
    if len(connections) > limits.max_connections:
        transport.abort()
        return False
    return True


def _on_h11(limits: ListenerLimits) -> type[H11Protocol]:
    class Guarded(H11Protocol):
        _deadline: _HeadDeadline | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if _accepted(self.connections, limits, transport):
                self._deadline = _HeadDeadline(self.loop, limits, transport)
                # h11: the client has not left IDLE, so it has not sent a whole request head.
                self._deadline.waiting = lambda: self.conn.their_state is h11.IDLE
                self._deadline.arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._deadline is not None:
                self._deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.disarm()
            super().connection_lost(exc)

    return Guarded


class _Corked:
    """A connection's transport whose writes within one turn of the event loop leave as one.

    uvicorn writes an answer's head and its body separately: two segments, and two wakeups of
    the client, for one answer. Held until the loop's next turn, they go in one write; a close
    sends what is held first, an abort drops it. Everything else is the transport's own.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _on_httptools(limits: ListenerLimits) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Guarded(HttpToolsProtocol):
        _deadline: _HeadDeadline | None = None
        _awaiting_head = True

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            corked = cast(asyncio.Transport, _Corked(transport, self.loop))
            super().connection_made(corked)
            transport = corked
            if _accepted(self.connections, limits, transport):
                self._deadline = _HeadDeadline(self.loop, limits, transport)
                self._deadline.waiting = lambda: self._awaiting_head
                self._deadline.arm()

        _lost: _LostCallbacks | None = None

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade: a request
                if self._lost is None:
                    self._lost = _LostCallbacks()
                extensions: dict[str, Any] = cast(Scope, self.scope).setdefault("extensions", {})
                extensions[ON_DISCONNECT] = self._lost.watch(lambda: cycle.response_complete)

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a request whose head came is answered next
            super().on_response_complete()
            if self._deadline is not None and not pipelined:
                self._awaiting_head = True
                self._deadline.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.disarm()
            super().connection_lost(exc)
            if self._lost is not None:
                self._lost.fire()

    return Guarded


class _LostCallbacks:
    """Step 5 for one connection: the callbacks its requests registered through ``ON_DISCONNECT``,
    called once it is lost, each if its request had not been answered whole by then. That is
    judged per request, not by uvicorn's ``disconnected`` flag, which a lost connection sets
    only on the request read last: with pipelined requests, not on the one being answered."""

    def __init__(self) -> None:
        self._callbacks: dict[int, tuple[Callable[[], bool], Callable[[], None]]] = {}
        self._next = 0
        self._lost = False

    def watch(self, answered: Callable[[], bool]) -> OnDisconnect:
        def on_disconnect(callback: Callable[[], None]) -> Callable[[], None]:
            if self._lost and not answered():  # lost before it asked
                callback()
                return _nothing
            key = self._next = self._next + 1
            self._callbacks[key] = (answered, callback)

            def forget() -> None:
                self._callbacks.pop(key, None)

            return forget

        return on_disconnect

    def fire(self) -> None:
        self._lost = True
        callbacks, self._callbacks = self._callbacks, {}
        for answered, callback in callbacks.values():
            if not answered():
                callback()


def _nothing() -> None:
    pass


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
