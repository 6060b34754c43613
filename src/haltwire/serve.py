"""Running ASGI apps on uvicorn inside an existing event loop, with an owner for each server.

``serving`` is used by the demos and the tests: it binds the socket first (so port 0 gives
a free port and the caller learns it), runs uvicorn in a task of the caller's task group,
and stops it when the block exits. ``serve_forever`` and ``serve_listeners`` are the control
plane's: one app on one or more sockets, each with its own limits (``haltwire.listener``),
stopped by SIGINT/SIGTERM. ``owned_server`` is the gateway's: served while its owner starts it.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal

import anyio
import uvicorn

from haltwire.listener import ListenerLimits, Parser, guarded_protocol

Lifespan = Literal["on", "off"]

logger = logging.getLogger("uvicorn.error")


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every chunked response (body, then terminator) stalls ~40 ms on delayed ACKs.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class InProcessServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signals alone: its owner stops it.

    uvicorn installs SIGINT/SIGTERM handlers bound to the server, and sse-starlette finds
    "the" server through the SIGTERM handler to drain event streams at shutdown; with
    several servers in one process, stopping one would drain the others' streams.
    """

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _BlockServer(InProcessServer):
    """``serving``'s server, stopped by ``stop()`` when the block exits, without uvicorn's idle waits.

    uvicorn notices ``should_exit`` on a 0.1 s tick, gives open connections a fixed 0.1 s to take
    their shutdown, then polls them every 0.1 s: 0.15-0.3 s a block, which every test that
    serves an app pays. Here ``stop()`` wakes the tick at once, and the shutdown is uvicorn's
    (listeners closed, each connection told to shut down, open responses and tasks awaited up
    to ``timeout_graceful_shutdown``, then cancelled, then the lifespan's shutdown) polling
    every 5 ms instead.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopped = anyio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stopped.set()

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with anyio.move_on_after(0.1):
                await self._stopped.wait()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        grace = self.config.timeout_graceful_shutdown
        with anyio.move_on_after(math.inf if grace is None else grace) as bounded:
            while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:  # noqa: ASYNC110 - uvicorn keeps sets, not events
                await anyio.sleep(0.005)
            for server in self.servers:
                await server.wait_closed()
        if bounded.cancelled_caught:
            logger.error("Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


@asynccontextmanager
async def serving(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    graceful_s: int | None = None,
    limits: ListenerLimits | None = None,
    lifespan: Lifespan = "on",
    parser: Parser = "auto",
) -> AsyncIterator[str]:
    """Serve ``app`` until the block exits; yields its base URL (``http://host:port``).

    ``graceful_s`` bounds the wait for open responses (a watch stream, say) at exit; ``parser``
    picks the HTTP parser of a server with ``limits`` (``haltwire.listener.guarded_protocol``).
    """
    sock = bind(host, port)
    actual = sock.getsockname()[1]
    config = _config(app, limits, lifespan, parser, timeout_graceful_shutdown=graceful_s)
    server = _BlockServer(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
            await anyio.sleep(0.005)
        try:
            yield f"http://{host}:{actual}"
        finally:
            server.stop()
    sock.close()


def fast_loop() -> dict[str, Any]:
    """``anyio.run``'s backend options for a command's process: uvloop when it is installed (the
    same asyncio code on a faster event loop: less CPU per call on the gateway's hot path)."""
    return {"use_uvloop": True} if importlib.util.find_spec("uvloop") is not None else {}


def listen(host: str, port: int) -> socket.socket:
    """``bind`` for a command: ``CannotListen`` (a sentence) when the address is taken or invalid."""
    try:
        return bind(host, port)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class CannotListen(Exception):
    """The command's address cannot be bound (in use, or not an address of this machine)."""


def _config(
    app: Any, limits: ListenerLimits | None, lifespan: Lifespan, parser: Parser = "auto", **extra: Any
) -> uvicorn.Config:
    # log_config None: uvicorn's loggers go through the root logger, in the process's format
    # (``haltwire.logs``: a JSON log is all JSON lines), not through handlers of uvicorn's own.
    if limits is None:
        return uvicorn.Config(app, lifespan=lifespan, log_level="warning", access_log=False, log_config=None, **extra)
    return uvicorn.Config(
        app,
        lifespan=lifespan,
        log_level="warning",
        access_log=False,
        log_config=None,
        http=guarded_protocol(limits, parser),
        timeout_keep_alive=int(max(1, limits.idle_timeout_s)),
        **extra,
    )


class SignalledServer(uvicorn.Server):
    """A server that takes SIGINT/SIGTERM as a clean stop: the process exits 0 once it has shut
    down. (uvicorn raises a signal it caught again after its shutdown, and SIGTERM's default
    action then ends the process with status 143.)"""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


async def serve_forever(app: Any, sock: socket.socket, limits: ListenerLimits | None = None) -> None:
    """Serve ``app`` on a socket bound beforehand (``listen``), until cancelled or SIGINT/SIGTERM."""
    await SignalledServer(_config(app, limits, "on")).serve([sock])


def owned_server(app: Any, limits: ListenerLimits | None = None, *, forwarded: bool = True) -> uvicorn.Server:
    """A server for an app its owner starts and stops itself, while it is served (no lifespan),
    leaving the process's signals to the owner too: ``should_exit`` stops it gracefully (open
    requests finish), ``force_exit`` at once, as uvicorn does on the signals it takes itself.
    ``forwarded``: trust ``X-Forwarded-*`` from loopback (uvicorn's default); False: the peer is
    the address that connected, whatever a request says."""
    return InProcessServer(_config(app, limits, "off", proxy_headers=forwarded))


class _Owner(SignalledServer):
    """The first of ``serve_listeners``' servers: it takes the process's signals, and runs
    ``stopping`` beside its own graceful shutdown, which then ends only once both have."""

    def __init__(
        self, config: uvicorn.Config, stopping: Callable[[], Coroutine[Any, Any, None]] | None
    ) -> None:
        super().__init__(config)
        self._stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        async with anyio.create_task_group() as tg:
            if self._stopping is not None:
                tg.start_soon(self._stopping)
            await super().shutdown(sockets)


async def serve_listeners(
    listeners: list[tuple[Any, socket.socket, ListenerLimits]],
    stopping: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Serve one app on several sockets (``(app, socket, limits)``: the app may be wrapped per
    socket), until cancelled or SIGINT/SIGTERM; ``stopping`` runs as they shut down. The first
    runs the app's lifespan, and the others start once it has: none of them answers before the
    app is ready."""
    first, *others = listeners
    servers: list[uvicorn.Server] = [_Owner(_config(first[0], first[2], "on"), stopping)]
    servers += [InProcessServer(_config(app, limits, "off")) for app, _, limits in others]

    ended = anyio.Event()

    async def first_then_the_rest() -> None:
        await servers[0].serve([first[1]])  # until SIGINT/SIGTERM (or a failed start-up)
        ended.set()
        for server in servers[1:]:
            server.should_exit = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_then_the_rest)
        while not servers[0].started and not ended.is_set():  # noqa: ASYNC110 - uvicorn has a flag
            await anyio.sleep(0.005)
        if ended.is_set():
            return
        for server, (_, sock, _) in zip(servers[1:], others, strict=True):
            tg.start_soon(server.serve, [sock])
