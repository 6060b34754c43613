"""An MCP client helper: every ``tools/call`` goes through the guard and carries the lease.

The token rides in ``params._meta["io.haltwire/lease"]`` and the run id in
``params._meta["io.haltwire/run"]``, so the gateway can verify the lease on its own
(level 3) even if this process stops checking.
"""

from __future__ import annotations

from typing import Any, cast

from mcp import Client
from mcp.types import CallToolResult, RequestParamsMeta

from haltwire.meta import LEASE_META, RUN_META
from haltwire.runtime.guard import Guard


class LeasedTools:
    def __init__(self, client: Client, guard: Guard) -> None:
        self.client = client
        self.guard = guard

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        """Call ``name`` under the lease; ``StopRequested`` once the run must stop."""
        run_id = self.guard.lease.run_id

        async def call(token: str) -> CallToolResult:
            # RequestParamsMeta is an open TypedDict; mypy cannot express its extra keys.
            meta = cast(RequestParamsMeta, {LEASE_META: token, RUN_META: run_id})
            return await self.client.call_tool(name, arguments, meta=meta)

        return await self.guard.call(call)
