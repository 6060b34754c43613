"""Moving bytes between a client and its target, counted on the connection (``Connection``).

Both functions run inside the connection's cancel scope (``haltwire.egress.proxy``): when a
stop, the lease's expiry or a stale watch cancels it, the copies are cancelled where they wait
and the caller closes both sockets, so the client's stream ends and the target sees the close.

- ``tunnel``: a ``CONNECT`` once answered 200. Two copies, one each way; when either side
  ends its stream (or fails), both are closed: a tunnel is over when one end is. No idle bound:
  a tunnel may idle as long as its lease lasts.
- ``forward``: one absolute-URI request. h11 parses both sides: the request goes on in origin
  form with hop-by-hop headers (RFC 9110 7.6.1: ``Connection`` and those it names,
  ``Proxy-Authorization``, ``Proxy-Connection``, ``Keep-Alive``, ``TE``, ``Upgrade``) left out and
  ``Connection: close`` added; its body streams through; the response comes back the same way.
  Each read waits at most ``idle_s``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc
import h11

from haltwire.egress.connections import Connection

CHUNK: Final = 65_536
_HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
    }
)
_GONE = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


async def tunnel(
    client: anyio.abc.SocketStream,
    target: anyio.abc.SocketStream,
    conn: Connection,
    first: bytes,
    screen: Callable[[bytes], bool | None] | None = None,
) -> None:
    """Copy bytes both ways until either side ends (``first``: bytes the client sent after its head).

    ``screen`` judges the client's first bytes before any of them reaches the target: None, it
    needs more (they are read and held meanwhile, while the target's bytes still flow down: a
    server may speak first); True, they go on; False, the tunnel is closed (the TLS SNI check).
    """

    async def up() -> None:
        pending = first
        if screen is not None:
            verdict = screen(pending)
            while verdict is None:
                pending += await client.receive(CHUNK)
                verdict = screen(pending)
            if not verdict:
                return  # closed with nothing sent: ``_until_over`` ends the other direction
        if pending:
            await target.send(pending)
            conn.sent += len(pending)
        while True:
            chunk = await client.receive(CHUNK)
            await target.send(chunk)
            conn.sent += len(chunk)

    async def down() -> None:
        while True:
            chunk = await target.receive(CHUNK)
            await client.send(chunk)
            conn.received += len(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_until_over, up, tg.cancel_scope)
        tg.start_soon(_until_over, down, tg.cancel_scope)


async def _until_over(copy: Callable[[], Awaitable[None]], both: anyio.CancelScope) -> None:
    """Run one direction of a relay; when it ends or breaks, end the other too."""
    try:
        await copy()
    except (*_GONE, h11.ProtocolError, TimeoutError):
        pass  # one end is over, broke the exchange, or went idle: so is the relay
    finally:
        both.cancel()


def _forwarded_headers(headers: list[tuple[bytes, bytes]], host: bytes) -> list[tuple[bytes, bytes]]:
    named = {
        token.strip().lower() for key, value in headers if key == b"connection" for token in value.split(b",")
    }
    out = [(k, v) for k, v in headers if k not in _HOP_BY_HOP and k not in named and k != b"host"]
    out.insert(0, (b"host", host))
    out.append((b"connection", b"close"))
    return out


async def forward(
    client: anyio.abc.SocketStream,
    server: h11.Connection,
    target: anyio.abc.SocketStream,
    request: h11.Request,
    conn: Connection,
    idle_s: float,
) -> None:
    """Forward one request and its response (see the module's docstring)."""
    raw = request.target
    after_scheme = raw.split(b"://", 1)[1]
    slash = after_scheme.find(b"/")
    authority = after_scheme if slash < 0 else after_scheme[:slash]
    path = b"/" if slash < 0 else after_scheme[slash:]
    upstream = h11.Connection(h11.CLIENT)
    # The Host is the URI's authority, whatever the client's Host said (RFC 9112 3.2.2).
    headers = _forwarded_headers(list(request.headers), authority)
    await _put(
        target, upstream, h11.Request(method=request.method, target=path, headers=headers), conn, up=True
    )

    async def body_up() -> None:
        while True:
            event = server.next_event()
            if event is h11.NEED_DATA:
                with anyio.fail_after(idle_s):
                    data = await client.receive(CHUNK)
                server.receive_data(data)
            elif isinstance(event, h11.Data):
                await _put(target, upstream, h11.Data(data=event.data), conn, up=True)
            elif isinstance(event, h11.EndOfMessage):
                await _put(target, upstream, h11.EndOfMessage(), conn, up=True)
                await anyio.sleep_forever()  # the request is sent: the response ends the exchange
            else:
                return

    async def response_down() -> None:
        while True:
            event = upstream.next_event()
            if event is h11.NEED_DATA:
                with anyio.fail_after(idle_s):
                    try:
                        data = await target.receive(CHUNK)
                    except anyio.EndOfStream:
                        data = b""
                upstream.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):  # 100 Continue, 103 Early Hints
                informational = h11.InformationalResponse(
                    status_code=event.status_code, headers=event.headers, reason=event.reason
                )
                await _put(client, server, informational, conn, up=False)
            elif isinstance(event, h11.Response):
                kept = [(k, v) for k, v in event.headers if k not in _HOP_BY_HOP]
                kept.append((b"connection", b"close"))
                response = h11.Response(status_code=event.status_code, headers=kept, reason=event.reason)
                await _put(client, server, response, conn, up=False)
            elif isinstance(event, h11.Data):
                await _put(client, server, h11.Data(data=event.data), conn, up=False)
            elif isinstance(event, h11.EndOfMessage):
                await _put(client, server, h11.EndOfMessage(), conn, up=False)
                return  # answered: whatever is left of the request is moot
            else:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(_until_over, body_up, tg.cancel_scope)
        tg.start_soon(_until_over, response_down, tg.cancel_scope)


async def _put(
    stream: anyio.abc.SocketStream, h: h11.Connection, event: h11.Event, conn: Connection, *, up: bool
) -> None:
    data = h.send(event)
    if not data:
        return
    await stream.send(data)
    if up:
        conn.sent += len(data)
    else:
        conn.received += len(data)
