"""Helpers for tests of the gateway's calls to HTTP upstreams: an upstream behind a recorder of
the requests it receives, and scripted ASGI upstreams answering as a test says."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from haltwire.demo.upstream import DemoUpstream
from haltwire.serve import serving
from haltwire.upstreams.http import ModernHttpCaller


@dataclass
class Seen:
    """One HTTP request as the upstream received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Recorder:
    requests: list[Seen] = field(default_factory=list)

    def calls(self) -> list[Seen]:
        return [r for r in self.requests if r.headers.get("mcp-method") == "tools/call"]

    def wrap(self, app: Any) -> Any:
        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            self.requests.append(Seen(scope["method"], scope["path"], headers, b"".join(chunks)))
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                return await receive()

            await app(scope, replay, send)

        return recorded


@asynccontextmanager
async def recorded_upstream(
    app: Any | None = None, *, port: int = 0
) -> AsyncIterator[tuple[DemoUpstream, str, Recorder]]:
    """The demo upstream (or ``app``) behind a recorder; yields it, its base URL and the recorder."""
    demo = DemoUpstream()
    recorder = Recorder()
    async with serving(recorder.wrap(app if app is not None else demo.http_app()), port=port) as url:
        yield demo, url, recorder


async def body_of(receive: Any) -> bytes:
    body = b""
    while True:
        m = await receive()
        body += bytes(m.get("body", b""))
        if not m.get("more_body"):
            return body


def scripted(
    answer: Callable[[str, dict[str, str], bytes], tuple[int, list[tuple[bytes, bytes]], bytes]],
) -> Any:
    """An ASGI app answering each request with ``answer(method, headers, body)``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await body_of(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        status, response_headers, content = answer(scope["method"], headers, body)
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": content})

    return app


@asynccontextmanager
async def caller_for(app: Any) -> AsyncIterator[tuple[ModernHttpCaller, Recorder]]:
    recorder = Recorder()
    async with serving(recorder.wrap(app)) as base:
        caller = ModernHttpCaller(f"{base}/mcp", "2026-07-28", [], name="up")
        try:
            yield caller, recorder
        finally:
            await caller.aclose()


SSE_HEADERS = [(b"content-type", b"text/event-stream")]
JSON_HEADERS = [(b"content-type", b"application/json")]
