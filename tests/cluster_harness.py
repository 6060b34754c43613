"""Calls through a gateway on a Redis Cluster (``redis_cluster``): the counters section, one call's
outcome as a word, and streams of calls logged with when each started and how long it took."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError

from haltwire.meta import LEASE_META
from leases_harness import mint
from redis_cluster import RedisClusterProcesses

#: A call refused because the counters could not be reached: retryable.
DOWN = "counters_unavailable:retryable"


def counters(cluster: RedisClusterProcesses, prefix: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The gateway's ``[counters]`` on ``cluster``, every node a startup node."""
    return {
        "backend": "redis",
        "cluster": True,
        "url": cluster.urls,
        "prefix": prefix,
        "timeout_s": timeout_s,
    }


async def call(
    client: Client, agent: str | None = None, run: str = "run-1", tool: str = "lookup_order"
) -> str:
    """The call's outcome: "ok", the refusal's code (with ``:retryable`` when it says so), or "error"."""
    meta = {LEASE_META: mint(run, agent)} if agent is not None else None
    try:
        result = await client.call_tool(tool, {"order_id": "o-1"}, meta=meta)  # type: ignore[arg-type]
    except MCPError:  # the upstream's JSON-RPC error, passed on
        return "error"
    if not result.is_error:
        return "ok"
    error = (result.structured_content or {}).get("error")
    if error is None:
        return "error"
    return f"{error['code']}:retryable" if error.get("retryable") else str(error["code"])


@dataclass(frozen=True, slots=True)
class Logged:
    started: float  # time.monotonic()
    took_s: float
    outcome: str


@dataclass
class CallStream:
    """One client's calls, one after another with ``pause_s`` between, until ``stop`` is set."""

    client: Client
    pause_s: float = 0.02
    log: list[Logged] = field(default_factory=list)
    stop: anyio.Event = field(default_factory=anyio.Event)

    async def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            outcome = await call(self.client)
            self.log.append(Logged(started, time.monotonic() - started, outcome))
            await anyio.sleep(self.pause_s)

    def between(self, start: float, end: float = float("inf")) -> list[Logged]:
        """The calls started in [start, end)."""
        return [c for c in self.log if start <= c.started < end]

    def count(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.log)
