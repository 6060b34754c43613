"""The admin listener: the control plane's port for operators, tripwires and viewers only.

The same app serves both listeners; on the admin one, a request whose bearer token is not an
operator's, a tripwire's or a viewer's is refused 403 before any route runs, so an agent, a
gateway or an executor that can reach the admin port still cannot load it with their traffic.
Unauthenticated requests get the routes' own 401 (``/healthz`` and ``/openapi.json`` answer).
"""

from __future__ import annotations

from typing import Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from haltwire.control.access import authenticate
from haltwire.control.errors import Refused
from haltwire.control.plane import Plane
from haltwire.control.routes.wire import answer

#: The roles the admin listener serves.
ADMIN_ROLES: Final = frozenset({"operator", "tripwire", "viewer"})


class AdminOnly:
    """ASGI middleware around the control plane's app (``create_app``), for the admin listener."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.plane: Plane = app.state.plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            header = request.headers.get("authorization")
            if header is not None:
                try:
                    role = authenticate(self.plane, header).role
                except Refused:
                    role = None  # the route answers 401 itself
                if role is not None and role not in ADMIN_ROLES:
                    refused = Refused(
                        403,
                        "forbidden",
                        f"role {role} is not served on the admin listener; use the control plane's port",
                        needed_roles=sorted(ADMIN_ROLES),
                    )
                    await answer(refused)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
