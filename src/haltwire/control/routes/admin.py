"""What each of the control plane's listeners serves: the admin listener (operators, tripwires,
viewers), the enforcement listener (gateways, executors) and the agents' listener (every role).

The same app serves every listener; on the first two, a request whose bearer token is not one of
the listener's roles is refused 403 before any route runs, so an agent that can reach either
port still cannot load it with its traffic. Unauthenticated requests get the routes' own 401
(``/healthz`` and ``/openapi.json`` answer). The agents' listener serves everyone, as it did
before the enforcement listener, but says in the log when an enforcement point follows it.
"""

from __future__ import annotations

import logging
from typing import Final

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from haltwire.control.access import authenticate
from haltwire.control.errors import Refused
from haltwire.control.plane import Plane
from haltwire.control.routes.dashboard.sessions import LISTENER_KEY
from haltwire.control.routes.wire import answer

log = logging.getLogger("haltwire.control")

#: The roles the admin listener serves.
ADMIN_ROLES: Final = frozenset({"operator", "tripwire", "viewer"})
#: The roles the enforcement listener serves: the enforcement points that follow the watch.
ENFORCEMENT_ROLES: Final = frozenset({"gateway", "executor"})


class OnlyRoles:
    """ASGI middleware around the control plane's app (``create_app``), for a listener that
    serves ``roles`` only; ``listener`` names it in the refusal."""

    def __init__(self, app: Starlette, roles: frozenset[str], listener: str) -> None:
        self.app = app
        self.plane: Plane = app.state.plane
        self.roles = roles
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # Which listener it came through: the dashboard is served on the admin listener only.
            scope[LISTENER_KEY] = self.listener
            request = Request(scope)
            header = request.headers.get("authorization")
            if header is not None:
                try:
                    role = authenticate(self.plane, header).role
                except Refused:
                    role = None  # the route answers 401 itself
                if role is not None and role not in self.roles:
                    refused = Refused(
                        403,
                        "forbidden",
                        f"role {role} is not served on the {self.listener} listener; use the control plane's port",
                        needed_roles=sorted(self.roles),
                    )
                    await answer(refused)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class AdminOnly(OnlyRoles):
    """The admin listener: operators, tripwires and viewers."""

    def __init__(self, app: Starlette) -> None:
        super().__init__(app, ADMIN_ROLES, "admin")


class EnforcementOnly(OnlyRoles):
    """The enforcement listener: gateways and executors."""

    def __init__(self, app: Starlette) -> None:
        super().__init__(app, ENFORCEMENT_ROLES, "enforcement")


class AgentsListener:
    """The agents' listener: every role is served, but a gateway or an executor that follows the
    watch here is named once in the log, since an agent flood on this port delays its pushes."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.plane: Plane = app.state.plane
        self._named: set[str] = set()  # identities, so bounded by the config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/watch":
            header = Headers(scope=scope).get("authorization")
            try:
                who = authenticate(self.plane, header) if header is not None else None
            except Refused:
                who = None  # the route answers 401 itself
            if who is not None and who.role in ENFORCEMENT_ROLES and who.name not in self._named:
                self._named.add(who.name)
                log.warning(
                    "%s %s follows the watch on the agents' listener, where an agent flood delays its "
                    "stops; point its [control] url at the enforcement listener",
                    who.role,
                    who.name,
                )
        await self.app(scope, receive, send)
