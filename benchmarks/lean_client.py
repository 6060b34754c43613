"""A lean client for ``benchmarks/gateway.py``'s second throughput figure.

The official client spends more CPU per call than the servers it measures (the report's
"client CPU"), so its throughput through a fast proxy is the client's, not the proxy's: direct
calls top out where the client does. This client sends the same sessionless ``tools/call`` as
raw JSON-RPC POSTs over kept-alive aiohttp connections (a fraction of the official client's
CPU per call), so a server's throughput shows. It speaks only the sessionless protocol
(2026-07-28), which every variant it is used on serves, and checks every answer, JSON or SSE.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import anyio
from mcp_types.version import LATEST_PROTOCOL_VERSION

_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": LATEST_PROTOCOL_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "haltwire-bench-lean", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


class LeanClient:
    """``async with LeanClient(url, headers, tool, concurrency) as lean: await lean.block(n)``"""

    def __init__(self, url: str, headers: dict[str, str], tool: str, concurrency: int, orders: Iterator[int]) -> None:
        self._url, self._tool, self._concurrency, self._orders = url, tool, concurrency, orders
        self._headers = {
            **headers,
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": LATEST_PROTOCOL_VERSION,
            "mcp-method": "tools/call",
            "mcp-name": tool,
        }
        self._ids = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LeanClient:
        connector = aiohttp.TCPConnector(limit=self._concurrency)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, amount_cents: int) -> bool:
        """One call; whether its answer is the upstream's result for its order."""
        assert self._session is not None
        order = str(next(self._orders))
        body = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": "tools/call",
            "params": {
                "name": self._tool,
                "arguments": {"order_id": order, "amount_cents": amount_cents},
                "_meta": _ENVELOPE,
            },
        }
        async with self._session.post(self._url, data=json.dumps(body), headers=self._headers) as answer:
            text = await answer.text()
            kind = answer.headers.get("content-type", "")
        return answer.status == 200 and _result(text, kind) == {"order_id": order, "status": "shipped"}

    async def block(self, n: int, amount_cents: int) -> tuple[float, int]:
        """``n`` calls by ``concurrency`` tasks: (calls per second, wrong answers)."""
        remaining, wrong = n, 0

        async def worker() -> None:
            nonlocal remaining, wrong
            while remaining > 0:
                remaining -= 1
                if not await self.call(amount_cents):
                    wrong += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(self._concurrency):
                tg.start_soon(worker)
        return n / (time.perf_counter() - started), wrong


def _result(text: str, content_type: str) -> Any:
    """The structured content of the answer's result, JSON or the result event of an SSE stream."""
    if content_type.startswith("text/event-stream"):
        datas = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        messages: list[dict[str, Any]] = [json.loads(d) for d in datas if d]
        message: dict[str, Any] = next((m for m in messages if "result" in m or "error" in m), {})
    else:
        message = json.loads(text)
    result = message.get("result") or {}
    return None if result.get("isError") else result.get("structuredContent")
