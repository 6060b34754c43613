"""Helpers for tests of runs and leases on the control plane: a config with every role, a
second agent, agent classes and lease keys; a control plane on loopback; registering runs,
renewing leases, issuing and clearing stops, reading the audit log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2

from control_harness import ROLES, TOKEN
from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving
from haltwire.tokens import LeaseKeys

SECRET = "k1-secret-" + "x" * 32
KEYS = LeaseKeys({"k1": SECRET.encode()})
LEASES = {"signing_key": "k1", "keys": [{"kid": "k1", "secret": SECRET}]}
CLASSES = {
    "default": {"ttl_s": 15, "renew_every_s": 5, "renew_timeout_s": 10},
    "fast": {"ttl_s": 3, "renew_every_s": 1, "renew_timeout_s": 2},
}
#: A second agent identity: another agent, tenant and version than ``agent-1`` (agent a1).
OTHER = {"name": "agent-2", "role": "agent", "token": "tok-agent2", "agent": "a2", "tenant": "beta"}


def config_dict(registry: dict[str, Any], leases: bool = True) -> dict[str, Any]:
    identities: list[dict[str, Any]] = [
        {
            "name": f"{role}-1",
            "role": role,
            "token": TOKEN[role],
            **({"agent": "a1", "tenant": "acme", "version": "2.1"} if role == "agent" else {}),
        }
        for role in ROLES
    ]
    data: dict[str, Any] = {
        "control": {"development": True},
        "registry": registry,
        "agent_classes": CLASSES,
        "identities": [*identities, OTHER],
    }
    if leases:
        data["leases"] = LEASES
    return data


@asynccontextmanager
async def plane(
    registry: dict[str, Any], leases: bool = True
) -> AsyncIterator[tuple[httpx2.AsyncClient, Stores]]:
    config = parse_control_config(config_dict(registry, leases))
    async with open_stores(config) as stores:
        async with serving(create_app(config, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client, stores


def auth(who: str | None) -> dict[str, str]:
    if who is None:
        return {}
    token = OTHER["token"] if who == "agent-2" else TOKEN[who]
    return {"Authorization": f"Bearer {token}"}


async def register(client: httpx2.AsyncClient, who: str = "agent", **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/runs", json=body, headers=auth(who))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def renew(client: httpx2.AsyncClient, run_id: str, who: str = "agent") -> httpx2.Response:
    return await client.post(f"/v1/runs/{run_id}/lease", headers=auth(who))


async def issue(client: httpx2.AsyncClient, scope: str) -> dict[str, Any]:
    r = await client.post("/v1/stops", json={"scope": scope, "reason": "runaway"}, headers=auth("operator"))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def clear(client: httpx2.AsyncClient, stop_id: str) -> None:
    r = await client.post(f"/v1/stops/{stop_id}/clear", json={"reason": "fixed"}, headers=auth("operator"))
    assert r.status_code == 200, r.text


async def audit(client: httpx2.AsyncClient) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = (await client.get("/v1/audit", headers=auth("operator"))).json()[
        "records"
    ]
    return records
