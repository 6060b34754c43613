"""The client side of ``benchmarks/gateway.py``'s (c): the official MCP client as the benchmark
uses it, one ``tools/call``, the latency and throughput blocks, the upstream's own counts, and the
CPU time a server process has used."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2

from gateway_common import AMOUNT_CENTS, TOKEN, TOOL, VariantStats

_orders = itertools.count(1)


class _Renamed:
    """A client whose calls of the benchmark's tool go to the name a proxy lists it under."""

    def __init__(self, client: Any, tool: str) -> None:
        self._client, self._tool = client, tool

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self._client.call_tool(self._tool if name == TOOL else name, arguments)


@contextlib.asynccontextmanager
async def mcp_client(
    url: str,
    lease: str | None = None,
    mode: str = "auto",
    headers: dict[str, str] | None = None,
    tool: str = TOOL,
) -> AsyncIterator[Any]:
    """The official MCP client over streamable HTTP, with a bearer token (or ``headers``; and
    ``lease`` in the ``Haltwire-Lease`` header on every request), no response cache; its calls
    of ``TOOL`` go to ``tool``, the name the server lists it under."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = dict(headers or {"Authorization": f"Bearer {TOKEN}"})
    if lease is not None:
        headers["Haltwire-Lease"] = lease
    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=60.0),
        limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64),
    )
    async with http, Client(streamable_http_client(url, http_client=http), cache=None, mode=mode) as client:
        # List once, as an agent does: the client validates structured results against the
        # listed output schema (it would otherwise list on the first call).
        listed = [t.name for t in (await client.list_tools()).tools]
        if tool not in listed:
            raise RuntimeError(f"{url} does not list {tool!r}: {listed}")
        yield client if tool == TOOL else _Renamed(client, tool)


async def one_call(client: Any) -> bool:
    order = str(next(_orders))
    result = await client.call_tool(TOOL, {"order_id": order, "amount_cents": AMOUNT_CENTS})
    return not result.is_error and result.structured_content == {"order_id": order, "status": "shipped"}


async def latency_block(client: Any, n: int, stats: VariantStats) -> None:
    clock = time.perf_counter
    lat: list[float] = []
    for _ in range(n):
        t0 = clock()
        ok = await one_call(client)
        lat.append((clock() - t0) * 1000)
        if not ok:
            stats.errors += 1
    stats.latencies_ms += lat
    stats.rounds_p50.append(statistics.median(lat))


async def throughput_block(client: Any, n: int, concurrency: int, stats: VariantStats) -> None:
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            if not await one_call(client):
                stats.errors += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    stats.throughput.append(n / (time.perf_counter() - t0))


async def upstream_counts(http: httpx2.AsyncClient, base: str) -> tuple[int, int]:
    """(HTTP POSTs of any kind, tool calls served) at the upstream so far."""
    posts = (await http.get(f"{base}/requests")).json().get("POST", 0)
    served = (await http.get(f"{base}/state")).json()["total_served"]
    return int(posts), int(served)
