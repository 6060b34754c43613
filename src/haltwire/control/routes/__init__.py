"""The control plane's HTTP API: every route, its OpenAPI document, and ``create_app`` that serves them.

A route parses its request, authorizes its caller by role, calls one rule of the control plane
(``haltwire.control.stops``, ``runs``, ``credentials``, ``intents``, ``reports``, ``calls``) and writes its
answer. Every write, and every refused write by a known caller, is audited by the rule. A
failing store answers 503 with a JSON error (fail closed), never a traceback. FastAPI serves
the routes and writes the document from them (``openapi.py``); it validates nothing
(``wire.py`` says why).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute

from haltwire.control import runs as runs_rule
from haltwire.control import wall_clock
from haltwire.control.config import ControlConfig
from haltwire.control.errors import Refused, unavailable
from haltwire.control.metrics import ControlMetrics
from haltwire.control.notify import receivers
from haltwire.control.plane import Plane
from haltwire.control.routes import (
    blast,
    calls,
    credentials,
    dashboard,
    firings,
    intent_batches,
    intents,
    openapi,
    reports,
    runs,
    stops,
)
from haltwire.control.routes.paging import Sender
from haltwire.control.routes.wire import answer
from haltwire.control.stores import Stores, open_stores
from haltwire.store.registry import RegistryUnavailable

routes: list[BaseRoute] = [
    *stops.routes,
    openapi.route,
    *runs.routes,
    *credentials.routes,
    *intents.routes,
    *intent_batches.routes,
    *reports.routes,
    *calls.routes,
    *firings.routes,
    *blast.routes,
]


#: Starlette answered HEAD wherever it answered GET; a FastAPI route answers only what it declares.
_heads = [
    APIRoute(r.path, r.endpoint, methods=["HEAD"], include_in_schema=False)
    for r in routes
    if isinstance(r, APIRoute) and "GET" in (r.methods or ())
]


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document, built once (it depends on code only, not on configuration)."""
    return openapi.document(routes)


class ControlApp(FastAPI):
    def openapi(self) -> dict[str, Any]:
        return document()  # FastAPI's own lacks what ``openapi.document`` adds


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return answer(exc)


async def _unavailable(request: Request, exc: Exception) -> Response:
    return answer(unavailable(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    # An unknown path or method: Starlette's plain-text answer, as before FastAPI (not its JSON).
    assert isinstance(exc, HTTPException)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


def create_app(
    config: ControlConfig, stores: Stores | None = None, *, rules: bool = True, pages: bool = True
) -> ControlApp:
    """The control plane. Without ``stores``, they open when the app starts and close when it stops.
    ``rules``: run the background rules (the wall-clock sweep); ``pages``: send the pages of
    ``[[notify]]``. Both off in the agents' process, so a control plane runs one of each, whatever
    its processes."""
    plane = Plane(config)
    sender = Sender(plane, receivers(config)) if pages and config.notify else None  # secrets read now

    @asynccontextmanager
    async def following(opened: Stores) -> AsyncIterator[None]:
        # The app owns these tasks: writes by other replicas wake our watchers, the audit head
        # the watch publishes is kept current, and pages are sent, until shutdown.
        plane.stores = opened
        await opened.audit.seal(time.time())  # records from before the log had a key, if any
        async with anyio.create_task_group() as tg:
            tg.start_soon(opened.registry.follow_writes, plane.wake)
            tg.start_soon(plane.follow_audit_head)
            tg.start_soon(runs_rule.record_grants, plane)  # each process its own grants
            if rules:
                tg.start_soon(wall_clock.sweep, plane)
            if sender is not None:
                tg.start_soon(sender.run)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                plane.stores = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if stores is not None:
            async with following(stores):
                yield
            return
        async with open_stores(config) as opened, following(opened):
            yield

    app = ControlApp(
        # The dashboard is not in the document: pages for people, served on the admin listener only.
        routes=[*routes, *_heads, *openapi.pages, dashboard.mount()],
        lifespan=lifespan,
        exception_handlers={Refused: _refused, RegistryUnavailable: _unavailable, HTTPException: _http_error},
        # The document is served by a route of its own (it is in the document), the pages too.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # No OpenTelemetry export configured from the environment: ~15 µs a request to check.
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    app.state.plane = plane
    app.state.metrics = ControlMetrics(plane)
    app.state.dashboard_sessions = dashboard.Sessions(config.dashboard.session_s)
    app.state.dashboard_board = dashboard.Board()
    return app
