"""A loopback TCP proxy for failure tests: forced disconnects and a silently blocked port.

``cut()`` resets every open connection (RST, as a crashed peer or a middlebox would).
``block()`` keeps connections open but forwards nothing in either direction, and holds new
connections without forwarding them, as a firewall dropping packets does: no FIN, no RST,
only silence. ``unblock()`` lets the held bytes and connections through again.
``stall_after_headers()`` unblocks, but lets each reply through only up to the end of its
HTTP headers: a stream that is accepted and then goes silent.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from anyio.abc import SocketAttribute


def _reset_on_close(stream: anyio.abc.SocketStream) -> None:
    # SO_LINGER 0: closing sends RST instead of FIN, an abrupt disconnect.
    raw = stream.extra(SocketAttribute.raw_socket)
    with contextlib.suppress(OSError):  # closed already by its peer's side: nothing to reset
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``; see ``running``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target_host, self.target_port = target_host, target_port
        self.port = 0
        self.accepted = 0
        #: Chunks of bytes the target sent back so far (a client waiting for each answer makes
        #: one or more per statement; a pipeline's answers come together).
        self.replies = 0
        self._open = anyio.Event()
        self._open.set()
        self._headers_only = False
        self._live: dict[anyio.CancelScope, list[anyio.abc.SocketStream]] = {}

    @property
    def connections(self) -> int:
        """Connections currently open through the proxy."""
        return len(self._live)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> int:
        """Reset every open connection; answers how many were cut."""
        cut = 0
        for scope, streams in list(self._live.items()):
            for stream in streams:
                _reset_on_close(stream)
            scope.cancel()
            del self._live[scope]
            cut += 1
        return cut

    def block(self) -> None:
        """Forward nothing, accept nothing onward, close nothing: silence until ``unblock``."""
        if self._open.is_set():
            self._open = anyio.Event()

    def unblock(self) -> None:
        self._headers_only = False
        self._open.set()

    def stall_after_headers(self) -> None:
        self._headers_only = True
        self._open.set()

    async def _passable(self) -> None:
        while not self._open.is_set():
            await self._open.wait()

    async def _pump(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, reply: bool = False
    ) -> None:
        try:
            async for chunk in source:
                await self._passable()
                self.replies += reply
                if reply and self._headers_only:
                    head, end, _ = chunk.partition(b"\r\n\r\n")
                    await sink.send(head + end)
                    await anyio.sleep_forever()
                await sink.send(chunk)
            await self._passable()
            await sink.send_eof()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.accepted += 1
        with anyio.CancelScope() as scope:
            self._live[scope] = [client]
            try:
                await self._passable()  # a connection made while blocked waits, unanswered
                async with await anyio.connect_tcp(self.target_host, self.target_port) as upstream:
                    self._live[scope].append(upstream)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._pump, client, upstream)
                        await self._pump(upstream, client, reply=True)
                        tg.cancel_scope.cancel()  # the target closed: close the client too
            except OSError:
                pass  # the target refused: the client sees the connection close
            finally:
                self._live.pop(scope, None)
        await client.aclose()

    @classmethod
    @asynccontextmanager
    async def running(cls, target_port: int, target_host: str = "127.0.0.1") -> AsyncIterator[TcpProxy]:
        """A proxy listening on a free loopback port until the block exits."""
        proxy = cls(target_port, target_host)
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        proxy.port = listener.extra(SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, proxy._handle, tg)
            try:
                yield proxy
            finally:
                proxy.unblock()
                proxy.cut()
                tg.cancel_scope.cancel()
