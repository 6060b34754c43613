"""Test helpers: the ``haltwire demo refunds`` stack served in this process, on loopback.

The demo's own configs (``haltwire.demo.refunds_stack``: leases, the broker, the gateway's
tripwires, a stop for any run past five ``issue_refund`` calls among them; no page receiver),
with the control plane, the shop, the gateway and, when asked, the executor each a real server
or task on real sockets, so a test can change one key of a config and read the shop's ledger
directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2

from haltwire.control import create_app as create_control_app
from haltwire.control import parse_control_config
from haltwire.demo.refunds_stack import TOKENS as STACK_TOKENS
from haltwire.demo.refunds_stack import agent_token, control_config, gateway_config, runtime_token
from haltwire.demo.shop import Shop
from haltwire.executor import run_executor
from haltwire.gateway.config import parse_config
from haltwire.serve import serving
from harness import running_gateway

#: The demo's tokens, with the support agent's (the first run's tenant) as ``agent`` and ``runtime``.
TOKENS = {**STACK_TOKENS, "agent": agent_token(1), "runtime": runtime_token(1)}

__all__ = ["TOKENS", "RefundsStack", "refunds_stack"]


@dataclass
class RefundsStack:
    control_url: str
    gateway_url: str
    shop: Shop

    async def intents(self) -> list[dict[str, Any]]:
        """Every intent the control plane recorded, as an operator reads them."""
        headers = {"Authorization": f"Bearer {TOKENS['operator']}"}
        async with httpx2.AsyncClient(base_url=self.control_url, timeout=10) as http:
            r = await http.get("/v1/intents", params={"limit": 1000}, headers=headers)
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["intents"]
        return found


@asynccontextmanager
async def refunds_stack(
    tmp_path: Path,
    *,
    gateway: Callable[[dict[str, Any]], None] = lambda data: None,
    executor: bool = True,
) -> AsyncIterator[RefundsStack]:
    """The stack; ``gateway`` edits the gateway's config dict (the executor reads the same)."""
    shop = Shop(tmp_path / "ledger.db")
    control_data = control_config(tmp_path / "control.db", 0, 0, 0, "http://127.0.0.1:9", 1)
    del control_data["notify"]
    control = parse_control_config(control_data)
    try:
        async with (
            serving(shop.http_app()) as shop_url,
            serving(create_control_app(control), graceful_s=1) as control_url,
        ):
            data = gateway_config(0, control_url, control_url, shop_url, 1)
            gateway(data)
            async with running_gateway(data) as (_, gateway_url), anyio.create_task_group() as tg:
                if executor:
                    await tg.start(run_executor, parse_config(data))
                yield RefundsStack(control_url, gateway_url, shop)
                tg.cancel_scope.cancel()
    finally:
        shop.close()
