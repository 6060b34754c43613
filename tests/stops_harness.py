"""Helpers for tests of stops through a gateway: a control plane with a fast heartbeat, a
gateway following it within a short staleness bound, issuing and clearing stops, the refusal
code of a call, and polling until a probe holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client

from control_harness import auth
from control_harness import config_dict as control_config
from haltwire.control import create_app, parse_control_config
from haltwire.serve import serving
from harness import config_dict

HEARTBEAT_S = 0.2
STALENESS_S = 1.0


@asynccontextmanager
async def control_plane(db: Path, port: int = 0) -> AsyncIterator[str]:
    """A control plane on ``port`` with its registry in ``db``; yields its base URL."""
    config = parse_control_config(control_config({"backend": "sqlite", "path": str(db)}, HEARTBEAT_S))
    async with serving(create_app(config), port=port, graceful_s=1) as url:
        yield url


def gateway_config(upstream: str, control: str) -> dict[str, Any]:
    link = {"url": control, "token": "tok-gateway", "staleness_s": STALENESS_S}
    return config_dict(upstream, control=link)


async def issue(url: str, scope: str, reason: str = "runaway") -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=url, timeout=10) as http:
        r = await http.post("/v1/stops", json={"scope": scope, "reason": reason}, headers=auth("operator"))
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def clear(url: str, stop_id: str) -> None:
    async with httpx2.AsyncClient(base_url=url, timeout=10) as http:
        r = await http.post(f"/v1/stops/{stop_id}/clear", json={"reason": "ok"}, headers=auth("operator"))
    assert r.status_code == 200, r.text


async def code_of(client: Client, tool: str = "lookup_order") -> str | None:
    """The refusal code of one call, or None when it was served."""
    result = await client.call_tool(tool, {"order_id": "A-1"})
    if not result.is_error:
        return None
    error = (result.structured_content or {}).get("error", {})
    code: str | None = error.get("code")
    return code


async def until(probe: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    """Poll ``probe`` until it holds; fails after ``within`` seconds."""
    with anyio.fail_after(within):
        while not await probe():
            await anyio.sleep(0.05)
