"""Helpers for tests of the gateway's tripwires: a gateway config with tripwire rules and leases,
the stack they run in, the outcome of a call in a run, the stops a firing wrote, and per rule
kind the call that counts and when it trips."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.shared.exceptions import MCPError

from control_harness import auth
from haltwire.gateway import GatewayApp
from haltwire.meta import LEASE_META
from harness import TOKENS, connect, running_gateway, running_upstream
from leases_harness import LEASES, mint
from stops_harness import control_plane, gateway_config


def config(
    upstream: str, cp: str, rules: list[dict[str, Any]], stops_url: str | None = None
) -> dict[str, Any]:
    data = gateway_config(upstream, cp)
    # Nothing here is about staleness: a bound that a loaded machine's watch cannot miss.
    data["control"]["staleness_s"] = 15.0
    data["leases"] = LEASES
    data["tripwires"] = rules
    data["tripwire_stops"] = {"url": stops_url or cp, "token": "tok-tripwire"}
    return data


@asynccontextmanager
async def stack(
    tmp_path: Path, rules: list[dict[str, Any]], stops_url: str | None = None
) -> AsyncIterator[tuple[GatewayApp, str, Client]]:
    """(gateway app, control plane URL, ops-bot's MCP client)."""
    async with AsyncExitStack() as s:
        cp = await s.enter_async_context(control_plane(tmp_path / "control.db"))
        _, up = await s.enter_async_context(running_upstream())
        app, url = await s.enter_async_context(running_gateway(config(up, cp, rules, stops_url)))
        client = await s.enter_async_context(connect(url, TOKENS["ops-bot"]))
        yield app, cp, client


async def outcome(client: Client, run: str, tool: str = "lookup_order", **arguments: Any) -> str | None:
    """The call's refusal code ("error" for an upstream error), or None when served."""
    try:
        result = await client.call_tool(tool, arguments, meta={LEASE_META: mint(run)})  # type: ignore[arg-type]
    except MCPError:  # the upstream's JSON-RPC error, passed on
        return "error"
    if not result.is_error:
        return None
    error = (result.structured_content or {}).get("error")
    return "error" if error is None else str(error["code"])


async def stops_of(cp: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/stops", headers=auth("operator"))
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["stops"]
    return found


# Per kind: the rule, the call that counts (tool, arguments), how many pass before the trip,
# and whether the call that trips is refused itself (admission kinds) or served (result kinds).
KINDS: dict[str, tuple[dict[str, Any], str, dict[str, Any], int, bool]] = {
    "steps": ({"kind": "steps", "limit": 3}, "lookup_order", {"order_id": "A-1"}, 3, True),
    "money": (
        {"kind": "money", "limit": 1000, "amount": "amount_cents", "tools": ["lookup_order"]},
        "lookup_order",
        {"order_id": "A-1", "amount_cents": 250},
        4,
        True,
    ),
    "rate": (
        {"kind": "rate", "limit": 3, "window_s": 3600, "per": "run"},
        "lookup_order",
        {"order_id": "A-1"},
        3,
        True,
    ),
    "repeated_calls": (
        {"kind": "repeated_calls", "in_a_row": 3},
        "lookup_order",
        {"order_id": "A-1"},
        2,
        True,
    ),
    "policy_hits": ({"kind": "policy_hits", "in_a_row": 3}, "fail", {}, 3, False),
    "repeated_results": (
        {"kind": "repeated_results", "in_a_row": 3},
        "lookup_order",
        {"order_id": "A-1"},
        3,
        False,
    ),
}


def served_code(tool: str) -> str | None:
    return "error" if tool == "fail" else None
