"""The canary runtimes of a drill: each registers a run in the drill tenant and calls
``canary_write`` in a loop through the gateway, noting what it sees on a ``CanaryRun``.

- ``well_behaved`` (levels 1 and 2): the SDK's ``Lease`` (renewal, expiry, the pushed stop),
  ``Guard`` and ``LeasedTools``. In this order, for each call: the lease is checked, the call is
  made under the guard, its answer noted; the loop ends at the first refusal, whether it comes
  from the lease (``StopRequested``) or from the gateway (a tool stop is the gateway's alone).
- ``ignoring`` (level 3 alone): registers a run and keeps renewing its lease in the background,
  but ignores every refusal, of a renewal or of a call: it keeps calling with the last lease
  token it holds until the drill cancels it. Only the gateway can stop it.

Times are ``time.time()``, comparable with the canary upstream's record on the same machine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, cast

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, RequestParamsMeta

from haltwire.drill.canary import TOOL
from haltwire.drill.stack import AGENT_CLASS, TOKENS
from haltwire.meta import LEASE_META, RUN_META
from haltwire.runtime import (
    ControlClient,
    ControlRefused,
    ControlUnreachable,
    Guard,
    Lease,
    LeasedTools,
    StopRequested,
)

#: The pause between two side effects of one canary run.
PACE_S: Final = 0.02
#: A control-plane request of the canaries gives up after this long (a paused control plane).
CONTROL_TIMEOUT_S: Final = 1.0


@dataclass
class CanaryRun:
    """What one canary run saw: its id, the calls served, its first refusal, its lease's end."""

    runtime: str
    run_id: str = ""
    served: int = 0
    refused_at: float | None = None
    refusal: str | None = None
    lease_end_at: float | None = None
    #: When a stream or tunnel open at the stop was closed under it (``drill.canaries``).
    cut_at: float | None = None
    first_served: anyio.Event = field(default_factory=anyio.Event)
    refused: anyio.Event = field(default_factory=anyio.Event)
    #: Set by the drill just before the stop: only refusals from then on are the stop's.
    armed: bool = False
    #: The codes of refusals before that (a gateway that had not yet heard the last clear, say).
    early: list[str] = field(default_factory=list)

    def note(self, result: CallToolResult) -> None:
        if not result.is_error:
            self.served += 1
            self.first_served.set()
            return
        error = (result.structured_content or {}).get("error", {})
        self.refuse(str(error.get("code", "error")) if isinstance(error, dict) else "error")

    def refuse(self, code: str) -> None:
        if not self.armed:
            self.early.append(code)
        elif self.refused_at is None:
            self.refused_at, self.refusal = time.time(), code
            self.refused.set()


def control_client(url: str, token: str = TOKENS["runtime"]) -> ControlClient:
    """The canary runtime's client of the control plane's agents' listener."""
    return ControlClient(url, token, timeout_s=CONTROL_TIMEOUT_S)


@asynccontextmanager
async def mcp_client(url: str, token: str = TOKENS["agent"]) -> AsyncIterator[Client]:
    """The official MCP client on the gateway, as the canary agent."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(10.0, read=30.0))
    async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
        yield client


def _args(run: CanaryRun, n: int) -> dict[str, Any]:
    return {"run": run.run_id, "what": f"write-{n}"}


async def well_behaved(run: CanaryRun, control: ControlClient, client: Client) -> None:
    """Levels 1 and 2: calls under the lease and the guard until the first refusal."""
    async with Lease.start(control, agent_class=AGENT_CLASS, tools=[TOOL]) as lease:
        run.run_id = lease.run_id
        tools = LeasedTools(client, Guard(lease))

        async def note_the_end() -> None:
            await lease.ended.wait()
            run.lease_end_at = time.time()

        async with anyio.create_task_group() as tg:
            tg.start_soon(note_the_end)
            n = 0
            while True:
                try:
                    result = await tools.call_tool(TOOL, _args(run, n))
                except StopRequested as exc:
                    run.refuse(exc.notice.code)
                    break
                run.note(result)
                if result.is_error:
                    break
                n += 1
                await anyio.sleep(PACE_S)
            # A tool stop is the gateway's: the lease still holds, and ends with the block.
            tg.cancel_scope.cancel()


async def ignoring(run: CanaryRun, control: ControlClient, client: Client) -> None:
    """Level 3 alone: calls with its last lease token until cancelled, ignoring every refusal."""
    registration = await control.register_run(agent_class=AGENT_CLASS, tools=[TOOL])
    run.run_id = registration.grant.run_id
    token = registration.grant.token
    every_s = registration.grant.renew_every_s

    async def renew_ignoring_refusals() -> None:
        nonlocal token
        while True:
            await anyio.sleep(every_s)
            try:
                with anyio.fail_after(CONTROL_TIMEOUT_S):
                    token = (await control.renew(run.run_id)).token
            except (ControlRefused, ControlUnreachable, TimeoutError):
                pass  # it does not care

    async with anyio.create_task_group() as tg:
        tg.start_soon(renew_ignoring_refusals)
        n = 0
        while True:
            meta = cast(RequestParamsMeta, {LEASE_META: token, RUN_META: run.run_id})
            run.note(await client.call_tool(TOOL, _args(run, n), meta=meta))
            n += 1
            await anyio.sleep(PACE_S)
