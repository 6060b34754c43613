"""``--access-log``: one info line per HTTP request on ``haltwire.access`` (method, path, status,
duration, client), from an ASGI wrapper put around a listener's app only when asked for, so a
process without it pays nothing per request. The query string is left out (it may hold ids)."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("haltwire.access")


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)  # the wrapped app's attributes (``state``, ``started``)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        started = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            ms = round((time.perf_counter() - started) * 1000, 2)
            client = scope.get("client")
            log.info(
                "%s %s %s %.2f ms",
                scope["method"],
                scope["path"],
                status,
                ms,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": ms,
                    "client": f"{client[0]}:{client[1]}" if client else None,
                },
            )


def logged(app: ASGIApp, on: bool) -> ASGIApp:
    """``app``, wrapped in ``AccessLog`` when ``on``."""
    return AccessLog(app) if on else app
