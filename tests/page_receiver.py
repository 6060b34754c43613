"""A page receiver on loopback for the paging tests and benchmark: a real HTTP server that records
what it is posted (``pages``), and can instead answer an error (``status``) or hang (``hang``)
until released."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from haltwire.serve import serving


class Receiver:
    def __init__(self, status: int = 200, hang: bool = False) -> None:
        self.status = status
        self.hang = hang
        #: (path, body as JSON, headers) of every page answered 2xx, in arrival order.
        self.pages: list[tuple[str, Any, dict[str, str]]] = []
        #: Requests received, answered or not.
        self.attempts = 0
        self.release = anyio.Event()
        self._arrived = anyio.Event()
        self.app = Starlette(routes=[Route("/{path:path}", self._hook, methods=["POST"])])

    async def _hook(self, request: Request) -> Response:
        self.attempts += 1
        self._poke()
        raw = await request.body()
        if self.hang:
            await self.release.wait()
        if not 200 <= self.status < 300:
            return PlainTextResponse("no", status_code=self.status)
        self.pages.append((request.url.path, json.loads(raw), dict(request.headers)))
        self._poke()
        return PlainTextResponse("ok", status_code=self.status)

    def _poke(self) -> None:
        arrived, self._arrived = self._arrived, anyio.Event()
        arrived.set()

    async def wait(self, pages: int = 0, attempts: int = 0, within: float = 10.0) -> None:
        """Until at least ``pages`` pages (and ``attempts`` requests) have come."""
        with anyio.fail_after(within):
            while len(self.pages) < pages or self.attempts < attempts:
                await self._arrived.wait()


@asynccontextmanager
async def receiving(receiver: Receiver, port: int = 0) -> AsyncIterator[str]:
    """Serve ``receiver``; yields its base URL. A hanging request is released at exit."""
    async with serving(receiver.app, port=port, graceful_s=1) as url:
        try:
            yield url
        finally:
            receiver.release.set()
