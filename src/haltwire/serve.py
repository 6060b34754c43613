"""Running ASGI apps on uvicorn inside an existing event loop, with an owner for each server.

``serving`` is used by the demos and the tests: it binds the socket first (so port 0 gives
a free port and the caller learns it), runs uvicorn in a task of the caller's task group,
and stops it when the block exits. ``serve_forever`` is the CLI's: one server per process,
stopped by SIGINT/SIGTERM.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import uvicorn


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


@asynccontextmanager
async def serving(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, graceful_s: int | None = None
) -> AsyncIterator[str]:
    """Serve ``app`` until the block exits; yields its base URL (``http://host:port``).

    ``graceful_s`` bounds the wait for open responses (a watch stream, say) at exit.
    """
    sock = bind(host, port)
    actual = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=graceful_s
    )
    server = InProcessServer(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
            await anyio.sleep(0.005)
        try:
            yield f"http://{host}:{actual}"
        finally:
            server.should_exit = True
    sock.close()


def listen(host: str, port: int) -> socket.socket:
    """``bind`` for a command: ``CannotListen`` (a sentence) when the address is taken or invalid."""
    try:
        return bind(host, port)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class CannotListen(Exception):
    """The command's address cannot be bound (in use, or not an address of this machine)."""


async def serve_forever(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` on a socket bound beforehand (``listen``), until cancelled."""
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    await uvicorn.Server(config).serve([sock])
