"""Many clients at once: raw JSON-RPC ``tools/call`` POSTs over kept-alive aiohttp connections.

The gateway's fast path serves these exactly as it serves the official client's modern
calls (one POST each), at a fraction of the client's CPU, so a test can run hundreds of
clients on two cores. Each client is a task with its own session (its own connections) and
sends its calls one after another; call ``k`` of client ``i`` goes to gateway ``(i + k) % n``,
or, with a ``seed``, to one chosen at random as a load balancer would (the same for a seed).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio

PROTOCOL = "2026-07-28"
#: Below the gateway's [gateway.listener] header_timeout_s (5 s by default).
KEEPALIVE_S = 2.0


def call_headers(token: str, tool: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }


def call_body(request_id: int, tool: str, arguments: dict[str, Any]) -> bytes:
    meta = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def outcome_of(status: int, text: str) -> str:
    """``ok``, a refusal's code, or what else came back (``client-error:`` what the client raised)."""
    if status == 0:
        return f"client-error:{text}"
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    if status != 200 or not isinstance(body, dict):
        return f"http-{status}"
    if "error" in body:
        return f"jsonrpc-{body['error'].get('code')}"
    result = body.get("result") or {}
    if not result.get("isError"):
        return "ok"
    error = (result.get("structuredContent") or {}).get("error") or {}
    return str(error.get("code", "no-code"))


@dataclass
class CrowdResult:
    outcomes: Counter[str] = field(default_factory=Counter)
    #: outcomes per gateway index
    by_gateway: list[Counter[str]] = field(default_factory=list)
    #: the most calls that were waiting for an answer at one time
    peak_in_flight: int = 0
    #: each call's time to its answer, in seconds
    latencies: list[float] = field(default_factory=list)


async def crowd(
    urls: list[str],
    token: str,
    *,
    clients: int,
    calls: int,
    tool: str = "lookup_order",
    timeout_s: float = 60.0,
    seed: int | None = None,
) -> CrowdResult:
    """``calls`` calls from ``clients`` clients at once, spread over ``urls``."""
    result = CrowdResult(by_gateway=[Counter() for _ in urls])
    shares = [calls // clients + (1 if i < calls % clients else 0) for i in range(clients)]
    rng = random.Random(seed)
    plan = [
        [(i + k) % len(urls) if seed is None else rng.randrange(len(urls)) for k in range(share)]
        for i, share in enumerate(shares)
    ]
    in_flight = 0
    headers = call_headers(token, tool)
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def client(i: int) -> None:
        nonlocal in_flight
        # A kept-alive connection is closed by the gateway once idle for its header_timeout_s
        # (5 s); reusing one just then is a disconnect. Idle ones are dropped here well before.
        connector = aiohttp.TCPConnector(limit=len(urls), keepalive_timeout=KEEPALIVE_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for k, g in enumerate(plan[i]):
                body = call_body(k, tool, {"order_id": f"c{i}-{k}"})
                in_flight += 1
                result.peak_in_flight = max(result.peak_in_flight, in_flight)
                sent = time.monotonic()
                try:
                    async with session.post(urls[g], data=body, headers=headers) as response:
                        status, text = response.status, await response.text()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status, text = 0, type(exc).__name__
                finally:
                    in_flight -= 1
                    result.latencies.append(time.monotonic() - sent)
                outcome = outcome_of(status, text)
                result.outcomes[outcome] += 1
                result.by_gateway[g][outcome] += 1

    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(client, i)
    return result
