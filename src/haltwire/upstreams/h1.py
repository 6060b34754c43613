"""A lean HTTP/1.1 client for ``tools/call`` to plain-HTTP upstreams (``haltwire.upstreams.http``).

aiohttp's request and response machinery cost about 0.2 ms of CPU per call here, a quarter of
the gateway's whole cost of a call (``benchmarks/gateway.py``). This writes each request in one
write, with its fixed headers encoded once, and reads the answer with httptools' parser (C),
over kept-alive connections. It serves ``http://`` upstreams reached directly; ``https://``
and upstreams behind a proxy stay on aiohttp.

Timeouts and cancellation, explicitly:

- opening a connection, or waiting for a free one when ``limit`` are busy, is bounded by
  ``connect_timeout_s`` (``TimeoutError``); everything after is bounded by the caller's deadline;
- a call cancelled, or failed, before its answer was read to the end closes its connection:
  that is how the upstream learns that the call was cancelled;
- a connection is reused only after an answer read to its end that allows keep-alive, and is
  closed once idle for ``KEEPALIVE_S`` (before servers drop it: POSTs are never retried).

Failures to reach or read the upstream raise ``OSError`` (``AnswerBroken`` for an answer that
breaks off or cannot be parsed).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from typing import Final, cast

import anyio
import httptools
from yarl import URL

from haltwire.upstreams.sessions import KEEPALIVE_S

#: Past this much unread answer, reading from the socket pauses until the reader catches up.
_HIGH_WATER: Final = 1 << 18


class AnswerBroken(ConnectionError):
    """The upstream's answer broke off, or was not HTTP/1.1."""


def encodable(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` can be written as they are (Latin-1, no line breaks); others go
    through aiohttp, which refuses them as it always did."""
    for name, value in headers.items():
        text = name + value
        if "\r" in text or "\n" in text or ":" in name:
            return False
        try:
            text.encode("latin-1")
        except UnicodeEncodeError:
            return False
    return True


class Answer:
    """One answer: its status and headers (names in lower case) once its head is read, then its
    body whole (``read``) or as it comes (``content.readany``), as aiohttp's response gives them."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._headed = False
        #: Read whole (``read``): never paused, the caller wants all of it.
        self._whole = False
        self.ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def content(self) -> Answer:
        return self

    # -- fed by the connection ------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _head(self, status: int) -> None:
        self.status, self._headed = status, True
        self._wake()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._whole:
            self._connection.pause()
        self._wake()

    def _end(self) -> None:
        self.ended = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self.ended:
            self._error = error
        self._wake()

    # -- read by the caller ---------------------------------------------------------------

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def head(self) -> None:
        while not self._headed:
            await self._wait()

    async def readany(self) -> bytes:
        """The next part of the body as it came, or ``b""`` at its end."""
        while not self._chunks and not self.ended:
            await self._wait()
        if not self._chunks:
            return b""
        data = self._chunks.popleft()
        self._buffered -= len(data)
        if self._buffered <= _HIGH_WATER:
            self._connection.resume()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        self._whole = True
        self._connection.resume()
        while not self.ended:
            await self._wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

    def release(self) -> None:
        """Done with this answer: its connection goes back to the pool if the answer was read
        to its end and allows keep-alive, else it is closed."""
        self._connection.done(reuse=self.ended and not self._chunks)

    def close(self) -> None:
        self._connection.done(reuse=False)


class _Connection(asyncio.Protocol):
    """One kept-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self._paused = False
        self._reusable = True
        #: Checked out: its slot is held until ``done``.
        self.busy = False
        self.idle_since = 0.0

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # nothing asked: a server speaking out of turn
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.answer._fail(AnswerBroken(f"the upstream's answer is not HTTP/1.1 ({exc})"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pool.forget(self)
        answer = self.answer
        if answer is not None and not answer.ended:
            if answer._headed and self._until_close(answer):
                answer._end()  # a body delimited by the connection's end
            else:
                answer._fail(AnswerBroken("the upstream closed the connection before its answer ended"))

    @staticmethod
    def _until_close(answer: Answer) -> bool:
        return "content-length" not in answer.headers and "chunked" not in answer.headers.get(
            "transfer-encoding", ""
        )

    # -- httptools callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        self.answer.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.answer is not None
        encoding = self.answer.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            self.answer._fail(AnswerBroken(f"the upstream answered in an encoding not asked for: {encoding}"))
            self.close()
            return
        self.answer._head(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.answer is not None
        self.answer._feed(body)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        if not self._parser.should_keep_alive():
            self._reusable = False
        self.answer._end()

    # -- the pool's side ------------------------------------------------------------------

    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def send(self, data: bytes) -> Answer:
        assert self._transport is not None
        self.answer = Answer(self)
        self._transport.write(data)
        return self.answer

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def done(self, *, reuse: bool) -> None:
        if not self.busy:
            return  # released already
        self.busy, self.answer = False, None
        if reuse and self._reusable and self.open:
            self._parser = httptools.HttpResponseParser(self)
            self._pool.checkin(self)
        else:
            self.close()
            self._pool.checkin(None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class Pool:
    """Connections to one ``http://`` URL: at most ``limit`` busy at once, idle ones reused."""

    def __init__(
        self, url: URL, *, limit: int, connect_timeout_s: float, headers: Mapping[str, str], user_agent: str
    ) -> None:
        assert url.scheme == "http" and url.host is not None
        self._host, self._port = url.host, url.port or 80
        self._timeout_s = connect_timeout_s
        name = f"[{url.host}]" if ":" in url.host else url.host  # an IPv6 address in brackets
        host = name if url.port in (None, 80) else f"{name}:{url.port}"
        fixed = {"host": host, "user-agent": user_agent, "accept-encoding": "identity"}
        fixed.update((k.lower(), v) for k, v in headers.items())  # as aiohttp: the configured win
        lines = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._head = f"POST {url.raw_path_qs} HTTP/1.1\r\n{lines}".encode("latin-1")
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []
        self._sweep: asyncio.TimerHandle | None = None
        self.closed = False

    async def post(self, headers: Mapping[str, str], body: bytes) -> Answer:
        """Send one POST with ``headers`` beside the fixed ones; the answer once its head is read."""
        connection = await self._checkout()
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        try:
            answer = connection.send(
                b"%s%scontent-length: %d\r\n\r\n%s" % (self._head, extra, len(body), body)
            )
            await answer.head()
        except BaseException:
            connection.done(reuse=False)
            raise
        return answer

    async def _checkout(self) -> _Connection:
        """A connection with its slot held: the newest idle one, else a new one. Waiting for a
        slot and opening a connection are each bounded by ``connect_timeout_s``; a call with
        a slot free and an idle connection opens no cancel scope (the common case)."""
        if self.closed:
            raise ConnectionAbortedError("the connection pool is closed")
        if self._slots.locked():
            try:
                with anyio.fail_after(self._timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                where = f"{self._host}:{self._port}"
                raise TimeoutError(f"no free connection to {where} within {self._timeout_s:g} s") from None
        else:
            await self._slots.acquire()  # a free slot: returns at once
        try:
            connection = self._reused() or await self._opened()
        except BaseException:
            self._slots.release()
            raise
        connection.busy = True
        return connection

    def _reused(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.close()
        return None

    async def _opened(self) -> _Connection:
        loop = asyncio.get_running_loop()
        with anyio.fail_after(self._timeout_s):
            _, connection = await loop.create_connection(lambda: _Connection(self), self._host, self._port)
        return connection

    def checkin(self, connection: _Connection | None) -> None:
        """A busy connection's slot is free again; ``connection`` is kept for the next call."""
        self._slots.release()
        if connection is None or self.closed:
            if connection is not None:
                connection.close()
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(KEEPALIVE_S, self._close_stale)

    def forget(self, connection: _Connection) -> None:
        """A connection the server closed, or will: not to be handed out again."""
        if connection in self._idle:
            self._idle.remove(connection)

    def _close_stale(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in [c for c in self._idle if now - c.idle_since >= KEEPALIVE_S]:
            self._idle.remove(connection)
            connection.close()
        if self._idle:
            self._sweep = loop.call_later(KEEPALIVE_S, self._close_stale)

    def close(self) -> None:
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in self._idle:
            connection.close()
        self._idle.clear()
