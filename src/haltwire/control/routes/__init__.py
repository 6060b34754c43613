"""The control plane's HTTP API: every route, and ``create_app`` that serves them.

A route parses its request, authorizes its caller by role, calls one rule of the control plane
(``haltwire.control.stops``, ``runs``, ``credentials``, ``intents``, ``reports``) and writes its
answer. Every write, and every refused write by a known caller, is audited by the rule. A
failing store answers 503 with a JSON error (fail closed), never a traceback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from haltwire.control.config import ControlConfig
from haltwire.control.errors import Refused, unavailable
from haltwire.control.plane import Plane
from haltwire.control.routes import credentials, intents, reports, runs, stops
from haltwire.control.routes.openapi import openapi_json
from haltwire.control.routes.wire import answer
from haltwire.control.stores import Stores, open_stores
from haltwire.store.registry import RegistryUnavailable

routes = [
    *stops.routes,
    Route("/openapi.json", openapi_json, methods=["GET"]),
    *runs.routes,
    *credentials.routes,
    *intents.routes,
    *reports.routes,
]


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return answer(exc)


async def _unavailable(request: Request, exc: Exception) -> Response:
    return answer(unavailable(exc))


def create_app(config: ControlConfig, stores: Stores | None = None) -> Starlette:
    """The control plane. Without ``stores``, they open when the app starts and close when it stops."""
    plane = Plane(config)

    @asynccontextmanager
    async def following(opened: Stores) -> AsyncIterator[None]:
        # The app owns this task: writes by other replicas wake our watchers until shutdown.
        plane.stores = opened
        async with anyio.create_task_group() as tg:
            tg.start_soon(opened.registry.follow_writes, plane.notify)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                plane.stores = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if stores is not None:
            async with following(stores):
                yield
            return
        async with open_stores(config.registry) as opened, following(opened):
            yield

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={Refused: _refused, RegistryUnavailable: _unavailable},
    )
    app.state.plane = plane
    return app
