"""Helpers for tests of the control plane's whole-run rules (escalation, the wall clock): a
control plane on loopback with tripwire and agent identities of two tenants and two versions,
its lease desk's clock injectable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2

from haltwire.control import create_app, parse_control_config
from haltwire.control.routes import ControlApp
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving

LEASES = {"signing_key": "k1", "keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
#: Agent identities: (name, agent, tenant, version).
AGENTS = {
    "acme": ("a1", "acme", "2.1"),
    "acme-22": ("a1", "acme", "2.2"),
    "beta": ("a1", "beta", "2.1"),
    "gamma": ("a1", "gamma", "2.1"),
}


def token(who: str) -> str:
    return f"tok-{who}"


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(who)}"}


def config_dict(registry: dict[str, Any], **extra: Any) -> dict[str, Any]:
    identities: list[dict[str, Any]] = [
        {"name": f"{role}-1", "role": role, "token": token(role)} for role in ("operator", "tripwire", "viewer")
    ]
    identities += [
        {"name": who, "role": "agent", "token": token(who), "agent": a, "tenant": t, "version": v}
        for who, (a, t, v) in AGENTS.items()
    ]
    return {
        "control": {"development": True},
        "registry": registry,
        "leases": LEASES,
        "identities": identities,
        **extra,
    }


@dataclass
class Plane:
    client: httpx2.AsyncClient
    stores: Stores
    app: ControlApp

    async def register(self, who: str, run_id: str, agent_class: str = "default") -> httpx2.Response:
        return await self.client.post(
            "/v1/runs", json={"run_id": run_id, "agent_class": agent_class}, headers=auth(who)
        )

    async def renew(self, who: str, run_id: str) -> httpx2.Response:
        return await self.client.post(f"/v1/runs/{run_id}/lease", headers=auth(who))

    async def stop(self, scope: str, who: str = "tripwire", reason: str = "tripped") -> dict[str, Any]:
        r = await self.client.post("/v1/stops", json={"scope": scope, "reason": reason}, headers=auth(who))
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    async def stops(self, every: bool = False) -> list[dict[str, Any]]:
        r = await self.client.get("/v1/stops", params={"all": "1"} if every else {}, headers=auth("operator"))
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()["stops"]
        return out

    async def audit(self, action: str | None = None) -> list[dict[str, Any]]:
        r = await self.client.get("/v1/audit", headers=auth("operator"))
        records: list[dict[str, Any]] = r.json()["records"]
        return [x for x in records if action is None or x["action"] == action]


@asynccontextmanager
async def rules_plane(
    registry: dict[str, Any],
    clock: Callable[[], float] | None = None,
    rules: bool = True,
    identities: Sequence[dict[str, Any]] = (),
    **extra: Any,
) -> AsyncIterator[Plane]:
    """A control plane on loopback (``config_dict``; ``extra``: more top-level tables), its lease
    desk on ``clock`` when given (set before the app starts, so the sweep reads it too);
    ``rules``: as ``create_app`` takes it (False: as the agents' process runs); ``identities``: more."""
    data = config_dict(registry, **extra)
    data["identities"] += list(identities)
    config = parse_control_config(data)
    async with open_stores(config) as stores:
        app = create_app(config, stores, rules=rules)
        if clock is not None:
            app.state.plane.leases.clock = clock
        async with serving(app) as url, httpx2.AsyncClient(base_url=url, timeout=10) as client:
            yield Plane(client, stores, app)
