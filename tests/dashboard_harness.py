"""Helpers for tests of the operators' dashboard: a control plane served as ``haltwire control``
serves it (the admin listener, the enforcement listener and the agents' listener, each its own
port, one app), its tokens, runs registered through the API, an intent awaiting approval, and a
signed-in httpx client."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from haltwire.control import AdminOnly, AgentsListener, EnforcementOnly, create_app, parse_control_config
from haltwire.control.routes import ControlApp
from haltwire.control.routes.dashboard import Sessions
from haltwire.serve import serving
from runs_harness import CLASSES, LEASES

#: Bearer tokens by who holds them.
TOKENS = {
    "operator": "tok-oncall",
    "viewer": "tok-viewer",
    "tripwire": "tok-tripwire",
    "gateway": "tok-gateway",
    "ops-bot": "tok-ops-runtime",
    "billing-bot": "tok-billing-runtime",
}
HEARTBEAT_S = 0.2


def config_dict(db: Path, session_s: float = 3600) -> dict[str, Any]:
    return {
        "control": {"development": True, "heartbeat_s": HEARTBEAT_S},
        "registry": {"backend": "sqlite", "path": str(db)},
        "leases": LEASES,
        "agent_classes": CLASSES,
        "dashboard": {"session_s": session_s},
        "identities": [
            {"name": "oncall", "role": "operator", "token": TOKENS["operator"]},
            {"name": "watcher", "role": "viewer", "token": TOKENS["viewer"]},
            {"name": "loop-guard", "role": "tripwire", "token": TOKENS["tripwire"]},
            {"name": "gateway-1", "role": "gateway", "token": TOKENS["gateway"]},
            # The demo gateway's agents (haltwire.demo.stack), as their runtimes register runs.
            {"name": "ops-runtime", "role": "agent", "token": TOKENS["ops-bot"], "agent": "ops-bot",
             "tenant": "acme", "version": "1.0"},
            {"name": "billing-runtime", "role": "agent", "token": TOKENS["billing-bot"],
             "agent": "billing-bot", "tenant": "acme", "version": "2.0"},
        ],
    }


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


@dataclass
class Plane:
    """The URLs of one control plane's listeners, and its app."""

    admin: str
    enforcement: str
    agents: str
    app: ControlApp
    #: The admin listener's server, closed by ``close_admin`` and opened again by ``open_admin``.
    admin_server: AsyncExitStack

    async def close_admin(self) -> None:
        """Close the admin listener and its open streams; the app, its stores and sessions stay."""
        await self.admin_server.aclose()

    async def open_admin(self) -> None:
        """Serve the admin listener again, on its port."""
        self.admin_server = AsyncExitStack()
        port = int(self.admin.rsplit(":", 1)[1])
        await self.admin_server.enter_async_context(_admin(self.app, port))

    @property
    def dashboard(self) -> str:
        return f"{self.admin}/dashboard/"

    @property
    def sessions(self) -> Sessions:
        found: Sessions = self.app.state.dashboard_sessions
        return found


def _admin(app: ControlApp, port: int = 0) -> AbstractAsyncContextManager[str]:
    return serving(AdminOnly(app), port=port, lifespan="off", graceful_s=1)


@asynccontextmanager
async def control_plane(tmp_path: Path, session_s: float = 3600) -> AsyncIterator[Plane]:
    """The three listeners of one app, as ``haltwire control`` serves them (one process here;
    the agents' listener runs the app's lifespan, so the admin listener can be dropped)."""
    app = create_app(parse_control_config(config_dict(tmp_path / "control.db", session_s)))
    async with (
        serving(AgentsListener(app), graceful_s=1) as agents,
        serving(EnforcementOnly(app), lifespan="off", graceful_s=1) as enforcement,
    ):
        stack = AsyncExitStack()
        admin = await stack.enter_async_context(_admin(app))
        plane = Plane(admin, enforcement, agents, app, stack)
        try:
            yield plane
        finally:
            await plane.admin_server.aclose()


async def register(plane: Plane, who: str, run_id: str, tools: tuple[str, ...] = ()) -> dict[str, Any]:
    """Register a run as an agent's runtime does (the agents' listener)."""
    async with httpx2.AsyncClient(base_url=plane.agents, timeout=10) as http:
        r = await http.post("/v1/runs", json={"run_id": run_id, "tools": list(tools)}, headers=bearer(who))
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def awaiting_approval(plane: Plane, run_id: str | None = None, key: str = "refund-1") -> str:
    """An intent awaiting approval, recorded as a gateway records one; answers its id."""
    intent = {
        "run_id": run_id,
        "agent": "ops-bot",
        "tenant": "acme",
        "version": "1.0",
        "tool": "refund",
        "arguments": {"order_id": "A-1", "amount": 120},
        "idempotency_key": key,
        "needs_approval": True,
    }
    async with httpx2.AsyncClient(base_url=plane.enforcement, timeout=10) as http:
        r = await http.post("/v1/intents", json=intent, headers=bearer("gateway"))
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "awaiting_approval"
    intent_id: str = r.json()["intent_id"]
    return intent_id


async def intent_state(plane: Plane, intent_id: str) -> str:
    async with httpx2.AsyncClient(base_url=plane.admin, timeout=10) as http:
        r = await http.get(f"/v1/intents/{intent_id}", headers=bearer("operator"))
    assert r.status_code == 200, r.text
    state: str = r.json()["state"]
    return state


async def audit_records(plane: Plane, target: str | None = None) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=plane.admin, timeout=10) as http:
        params = {"target": target} if target else {}
        r = await http.get("/v1/audit", params=params, headers=bearer("operator"))
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["records"]
    return records


async def active_stops(plane: Plane) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=plane.admin, timeout=10) as http:
        r = await http.get("/v1/stops", headers=bearer("operator"))
    assert r.status_code == 200, r.text
    stops: list[dict[str, Any]] = r.json()["stops"]
    return stops


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


@asynccontextmanager
async def signed_in(plane: Plane, who: str) -> AsyncIterator[tuple[httpx2.AsyncClient, str]]:
    """An httpx client signed in to the dashboard as ``who``, and its session's CSRF token."""
    async with httpx2.AsyncClient(base_url=plane.admin, timeout=10) as http:
        r = await http.post("/dashboard/sign-in", data={"token": TOKENS[who]})
        assert r.status_code == 303, r.text
        page = await http.get("/dashboard/")
        assert page.status_code == 200, page.text
        yield http, csrf_of(page.text)


class Stream:
    """Reads the dashboard's live stream: each event's name and its data (lines joined)."""

    def __init__(self, response: httpx2.Response) -> None:
        self._lines = response.aiter_lines()

    async def next_event(self) -> tuple[str, str]:
        name, data = "message", list[str]()
        async for line in self._lines:
            if not line:
                if data:
                    return name, "\n".join(data)
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
        raise AssertionError("the stream ended")
