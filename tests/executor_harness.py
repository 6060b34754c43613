"""Helpers for tests of the executor: a control plane with leases and a fast heartbeat, the shop
upstream (a side-effect recorder), a gateway config with intents on, the executor in-process,
and reading intents until they settle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2

from control_harness import TOKEN, auth
from haltwire.control import create_app, parse_control_config
from haltwire.demo.shop import ORDERS, Shop
from haltwire.executor import Executor, run_executor
from haltwire.gateway.config import parse_config
from haltwire.serve import serving
from harness import config_dict
from runs_harness import config_dict as control_config
from stops_harness import until

ORDER_IDS = sorted(ORDERS)


@asynccontextmanager
async def control_plane(db: Path | dict[str, Any], **sections: Any) -> AsyncIterator[str]:
    """Leases (the executor holds one), executor-1 and the other roles of test_control; a fast
    heartbeat so the gateway stays current. ``db``: a SQLite file, or a ``[registry]`` section."""
    data = control_config(db if isinstance(db, dict) else {"backend": "sqlite", "path": str(db)})
    data["control"]["heartbeat_s"] = 0.5
    data.update(sections)
    async with serving(create_app(parse_control_config(data)), graceful_s=1) as url:
        yield url


@asynccontextmanager
async def shop(tmp_path: Path, delay_s: float = 0.0) -> AsyncIterator[tuple[Shop, str]]:
    s = Shop(tmp_path / "ledger.db", delay_s=delay_s)
    try:
        async with serving(s.http_app()) as url:
            yield s, url
    finally:
        s.close()


def gateway_config(shop_url: str, control: str, **extra: Any) -> dict[str, Any]:
    data = config_dict(
        shop_url,
        control={"url": control, "token": TOKEN["gateway"], "staleness_s": 5},
        intents={"enabled": True},
        executor={"token": TOKEN["executor"], "poll_s": 0.05, "retry_s": 0.05},
        **extra,
    )
    data["upstreams"][0]["name"] = "shop"
    return data


@asynccontextmanager
async def executor(config: dict[str, Any]) -> AsyncIterator[Executor]:
    async with anyio.create_task_group() as tg:
        ex: Executor = await tg.start(run_executor, parse_config(config))
        yield ex
        tg.cancel_scope.cancel()


async def propose(
    cp: str, key: str, order: str = "A-1001", cents: int = 1000, run: str | None = "r-1"
) -> dict[str, Any]:
    """Record a refund intent as the gateway would."""
    body = {
        "run_id": run,
        "agent": "ops-bot",
        "tenant": "acme",
        "version": "1.0",
        "tool": "issue_refund",
        "arguments": {"order_id": order, "amount_cents": cents},
        "idempotency_key": key,
    }
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.post("/v1/intents", json=body, headers=auth("gateway"))
    assert r.status_code == 201, r.text
    intent: dict[str, Any] = r.json()
    return intent


async def intents(cp: str) -> dict[str, dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/intents", params={"limit": 1000}, headers=auth("operator"))
    assert r.status_code == 200, r.text
    return {i["idempotency_key"]: i for i in r.json()["intents"]}


async def as_executor(cp: str, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        return await http.request(method, path, headers=auth("executor"), **kwargs)


async def settled(cp: str, count: int, within: float = 10.0) -> dict[str, dict[str, Any]]:
    """The intents once ``count`` of them are terminal."""
    terminal = {"committed", "failed", "cancelled", "rejected"}

    async def done() -> bool:
        return sum(i["state"] in terminal for i in (await intents(cp)).values()) >= count

    await until(done, within)
    return await intents(cp)
