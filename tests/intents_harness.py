"""Helpers for tests of intents: a control plane with a second executor (and the runs config),
proposing, claiming and settling intents through its API; and a gateway config that turns calls
to irreversible tools into intents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2

from control_harness import TOKEN
from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving
from harness import config_dict
from runs_harness import OTHER
from runs_harness import config_dict as runs_config
from stops_harness import gateway_config

#: A second executor: it must not settle what the first one claimed.
EXECUTOR_2 = {"name": "executor-2", "role": "executor", "token": "tok-executor2"}
TOKENS = {**TOKEN, "agent-2": str(OTHER["token"]), "executor-2": EXECUTOR_2["token"]}


def auth(who: str | None) -> dict[str, str]:
    return {} if who is None else {"Authorization": f"Bearer {TOKENS[who]}"}


@asynccontextmanager
async def plane(
    registry: dict[str, Any], leases: bool = True
) -> AsyncIterator[tuple[httpx2.AsyncClient, Stores]]:
    data = runs_config(registry, leases)
    data["identities"].append(EXECUTOR_2)
    config = parse_control_config(data)
    async with open_stores(config) as stores:
        async with serving(create_app(config, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client, stores


def sqlite(tmp_path: Path) -> dict[str, Any]:
    return {"backend": "sqlite", "path": str(tmp_path / "control.db")}


def body(key: str, **overrides: Any) -> dict[str, Any]:
    return {
        "run_id": "r-1",
        "agent": "a1",
        "tenant": "acme",
        "version": "2.1",
        "tool": "refund",
        "arguments": {"order": key, "amount": 100},
        "idempotency_key": key,
        **overrides,
    }


async def propose(client: httpx2.AsyncClient, key: str, **overrides: Any) -> dict[str, Any]:
    r = await client.post("/v1/intents", json=body(key, **overrides), headers=auth("gateway"))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def claim(client: httpx2.AsyncClient, who: str = "executor") -> httpx2.Response:
    return await client.post("/v1/intents/claim", headers=auth(who))


async def settle(
    client: httpx2.AsyncClient, intent_id: str, action: str, who: str = "executor", **payload: Any
) -> httpx2.Response:
    return await client.post(f"/v1/intents/{intent_id}/{action}", json=payload or None, headers=auth(who))


async def issue(client: httpx2.AsyncClient, scope: str, reason: str = "runaway") -> dict[str, Any]:
    r = await client.post("/v1/stops", json={"scope": scope, "reason": reason}, headers=auth("operator"))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def get(client: httpx2.AsyncClient, intent_id: str, who: str = "operator") -> dict[str, Any]:
    r = await client.get(f"/v1/intents/{intent_id}", headers=auth(who))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def audit(client: httpx2.AsyncClient, action: str) -> list[dict[str, Any]]:
    records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
    return [r for r in records if r["action"] == action]


def intents_config(upstream: str, control: str | None, **link: Any) -> dict[str, Any]:
    """lookup_order is irreversible; sleep is irreversible and needs approval; the rest as annotated."""
    if control is None:
        data = config_dict(upstream)
    else:
        data = gateway_config(upstream, control)
        data["control"] = {**data["control"], **link}
    data["upstreams"][0]["labels"] = {"lookup_order": "irreversible", "sleep": "irreversible"}
    data["upstreams"][0]["approval"] = ["sleep"] if control is not None else []
    if control is not None:
        data["intents"] = {"enabled": True}
    return data


async def listed(cp: str, **params: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/intents", params=params, headers=auth("operator"))
    assert r.status_code == 200, r.text
    intents: list[dict[str, Any]] = r.json()["intents"]
    return intents
