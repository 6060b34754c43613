"""The lean HTTP/1.1 client of ``tools/call`` to plain-HTTP upstreams (``haltwire.upstreams.h1``).

Each test runs on asyncio's own loop and on uvloop (the gateway's, when installed), against a
raw TCP server on loopback that answers in the framings an ASGI server never produces: a body
delimited by the connection's end, an answer cut short, a compressed answer, one that is not
HTTP, and a connection closed while idle.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from yarl import URL

from haltwire.upstreams import h1
from haltwire.upstreams.http import ModernHttpCaller, UpstreamUnavailable

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


Reply = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A raw HTTP/1.1 server: reads each request (head and content-length body), lets ``reply``
    write whatever it likes; counts connections and requests."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.closed = anyio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                await self.reply(body, reader, writer)
                if writer.is_closing():
                    return
        finally:
            writer.close()
            self.closed.set()


@asynccontextmanager
async def raw_server(reply: Reply) -> AsyncIterator[tuple[Server, str]]:
    server = Server(reply)
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}/mcp"
    finally:
        listening.close()


def result_for(body: bytes) -> bytes:
    request_id = json.loads(body)["id"]
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"ok": request_id}}).encode()


async def framed(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    out = result_for(body)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(out)
    )
    # The head and the body in separate segments, as uvicorn writes them.
    await writer.drain()
    writer.write(out)


@asynccontextmanager
async def caller(url: str) -> AsyncIterator[ModernHttpCaller]:
    c = ModernHttpCaller(url, "2026-07-28", [], name="raw")
    assert c._lean is not None  # the lean path, not aiohttp
    try:
        yield c
    finally:
        await c.aclose()


async def test_calls_reuse_one_connection_and_send_one_request_each() -> None:
    async with raw_server(framed) as (server, url), caller(url) as c:
        for n in range(1, 6):
            assert await c.call_tool("t", {"n": n}, None, None) == {"ok": n}
    assert server.connections == 1 and len(server.requests) == 5
    head, body = server.requests[0]
    assert head.startswith(b"POST /mcp HTTP/1.1\r\n")
    assert b"\r\nmcp-name: t\r\n" in head and b"\r\nuser-agent: haltwire/" in head
    assert json.loads(body)["params"]["arguments"] == {"n": 1}


async def test_a_body_delimited_by_the_connections_end_is_read_whole() -> None:
    async def until_close(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.write(result_for(body))
        writer.close()

    async with raw_server(until_close) as (server, url), caller(url) as c:
        assert await c.call_tool("t", None, None, None) == {"ok": 1}
        assert await c.call_tool("t", None, None, None) == {"ok": 2}  # a new connection
    assert server.connections == 2


async def test_an_answer_cut_short_is_unavailable_and_its_connection_not_reused() -> None:
    cut = True

    async def reply(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if cut:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{")
            await writer.drain()
            writer.close()
        else:
            await framed(body, reader, writer)

    async with raw_server(reply) as (server, url), caller(url) as c:
        with pytest.raises(UpstreamUnavailable, match="before its answer ended"):
            await c.call_tool("t", None, None, None)
        cut = False
        assert await c.call_tool("t", None, None, None) == {"ok": 2}
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer, why",
    [
        (
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc",
            "encoding not asked for",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP/1.1"),
    ],
)
async def test_an_answer_that_cannot_be_read_is_unavailable(answer: bytes, why: str) -> None:
    async def reply(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer)

    async with raw_server(reply) as (_, url), caller(url) as c:
        with pytest.raises(UpstreamUnavailable, match=why):
            await c.call_tool("t", None, None, None)


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async def once(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await framed(body, reader, writer)
        await writer.drain()
        writer.close()  # keep-alive announced, then closed while idle

    async with raw_server(once) as (server, url), caller(url) as c:
        assert await c.call_tool("t", None, None, None) == {"ok": 1}
        with anyio.fail_after(5):
            await server.closed.wait()
        await anyio.sleep(0.05)  # the close reaches the client
        assert await c.call_tool("t", None, None, None) == {"ok": 2}
    assert server.connections == 2


async def test_a_connection_idle_past_the_keepalive_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h1, "KEEPALIVE_S", 0.2)
    async with raw_server(framed) as (server, url), caller(url) as c:
        assert await c.call_tool("t", None, None, None) == {"ok": 1}
        with anyio.fail_after(5):
            await server.closed.wait()  # closed by the client's sweep, not by the server
        assert await c.call_tool("t", None, None, None) == {"ok": 2}
    assert server.connections == 2


async def test_a_cancelled_call_closes_its_connection_and_frees_its_slot() -> None:
    answered = anyio.Event()

    async def never(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered.set()
        await reader.read()  # until the client closes the connection

    async with raw_server(never) as (server, url):
        pool = h1.Pool(URL(url), limit=1, connect_timeout_s=0.3, headers={}, user_agent="t")
        try:
            with anyio.move_on_after(5) as scope, anyio.CancelScope() as inner:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pool.post, {}, b"{}")
                    await answered.wait()
                    inner.cancel()
            assert not scope.cancelled_caught
            with anyio.fail_after(5):
                await server.closed.wait()  # the server sees the request's connection closed
            # The slot is free: the next request opens a connection at once.
            with anyio.move_on_after(0.2):
                await pool.post({}, b"{}")
            assert server.connections == 2
        finally:
            pool.close()


async def test_past_the_limit_a_call_waits_for_a_slot_then_times_out() -> None:
    async def slow(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1)
        await framed(body, reader, writer)

    async with raw_server(slow) as (server, url):
        pool = h1.Pool(URL(url), limit=1, connect_timeout_s=0.2, headers={}, user_agent="t")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.post, {}, b'{"id": 1}')
                await anyio.sleep(0.05)
                with pytest.raises(TimeoutError, match="no free connection"):
                    await pool.post({}, b'{"id": 2}')
        finally:
            pool.close()
    assert server.connections == 1


async def test_headers_that_cannot_be_written_as_they_are_take_aiohttp() -> None:
    assert h1.encodable({"authorization": "Bearer k"})
    assert not h1.encodable({"x-a": "one\r\nx-b: two"})
    assert not h1.encodable({"x-a": "caf\u00e9 \u2603"})
    for c in (
        ModernHttpCaller("http://127.0.0.1:1/mcp", "2026-07-28", [], headers={"x-a": "\u2603"}),
        ModernHttpCaller("https://127.0.0.1:1/mcp", "2026-07-28", []),
    ):
        assert c._lean is None and c._session is not None
        await c.aclose()


def test_the_host_header_names_the_port_only_when_not_80_and_brackets_an_ipv6_address() -> None:
    def head(url: str) -> bytes:
        return h1.Pool(URL(url), limit=1, connect_timeout_s=1, headers={}, user_agent="t")._head

    assert b"\r\nhost: [::1]:8080\r\n" in head("http://[::1]:8080/mcp")
    assert b"\r\nhost: example.test\r\n" in head("http://example.test/mcp?x=1")
    assert head("http://example.test/mcp?x=1").startswith(b"POST /mcp?x=1 HTTP/1.1\r\n")


async def test_answers_larger_than_the_read_buffer_are_read_whole_and_as_a_stream() -> None:
    # Far past the high-water mark (256 KiB): reading pauses and resumes. An SSE event stays
    # under the SSE decoder's own limit (1 MiB).
    sizes = {1: 3 * 1024 * 1024, 2: 900 * 1024}

    async def large(body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_id = json.loads(body)["id"]
        result = {"big": "x" * sizes[request_id]}
        text = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()
        kind = b"application/json" if request_id == 1 else b"text/event-stream"
        out = text if request_id == 1 else b"event: message\r\ndata: " + text + b"\r\n\r\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (kind, len(out)))
        for i in range(0, len(out), 65536):
            writer.write(out[i : i + 65536])
            await writer.drain()

    async with raw_server(large) as (_, url):
        c = ModernHttpCaller(url, "2026-07-28", [], name="raw")
        assert c._lean is not None
        try:
            with anyio.fail_after(10):
                assert len((await c.call_tool("t", None, None, None))["big"]) == sizes[1]  # JSON: read()
                assert len((await c.call_tool("t", None, None, None))["big"]) == sizes[2]  # SSE: readany()
        finally:
            await c.aclose()
