"""A looping agent is refused within the propagation bound after ``haltwire stop`` returns.

Real control plane, real gateway following it, real upstream, the official MCP client, and
the operator CLI. The control plane's heartbeat is 30 s and the gateway's staleness bound
60 s, so nothing but the watch stream's push can refuse the agent within ``BOUND_S``.
(The timing figures themselves are in benchmarks/stop_propagation.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from mcp import Client

from control_harness import TOKEN, cli
from control_harness import config_dict as control_config
from haltwire.control import create_app, parse_control_config
from haltwire.serve import serving
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio

HEARTBEAT_S = 30.0
STALENESS_S = 60.0
#: Generous for a busy machine, and far below the heartbeat: only a push arrives this soon.
BOUND_S = 2.0


@asynccontextmanager
async def quiet_control_plane(db: Path) -> AsyncIterator[str]:
    """A control plane whose watch streams are silent for 30 s unless something changes."""
    config = parse_control_config(control_config({"backend": "sqlite", "path": str(db)}, HEARTBEAT_S))
    async with serving(create_app(config), graceful_s=1) as url:
        yield url


@dataclass
class Outcome:
    started: float
    ended: float
    code: str | None  # None: served
    stop_id: str | None = None


@dataclass
class AgentLoop:
    """One agent calling ``lookup_order`` back to back on one MCP connection."""

    client: Client
    outcomes: list[Outcome] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def run(self) -> None:
        while True:
            started = anyio.current_time()
            result = await self.client.call_tool("lookup_order", {"order_id": "A-1"})
            error = (result.structured_content or {}).get("error", {}) if result.is_error else {}
            code = error.get("code", "no structured error") if result.is_error else None
            self.outcomes.append(Outcome(started, anyio.current_time(), code, error.get("stop_id")))
            changed, self.changed = self.changed, anyio.Event()
            changed.set()

    async def first(self, code: str | None, *, started_after: float, within: float) -> Outcome:
        """The first outcome with ``code`` of a call started after ``started_after``."""
        with anyio.move_on_after(within):
            while True:
                for o in self.outcomes:
                    if o.code == code and o.started >= started_after:
                        return o
                await self.changed.wait()
        raise AssertionError(f"no call {'served' if code is None else f'refused {code}'} within {within:g} s")


async def test_a_looping_agent_is_refused_soon_after_haltwire_stop_returns_and_served_after_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        quiet_control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway(
            config_dict(up, control={"url": cp, "token": "tok-gateway", "staleness_s": STALENESS_S})
        ) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
        anyio.create_task_group() as tg,
    ):
        agent = AgentLoop(client)
        tg.start_soon(agent.run)
        await agent.first(None, started_after=0.0, within=10.0)  # served before the stop
        operator = ("--url", cp, "--token", TOKEN["operator"])

        # The agent keeps calling while the CLI runs.
        assert await cli("stop", "--agent", "ops-bot", "--reason", "refund storm", *operator) == 0
        returned = anyio.current_time()
        stop_id = capsys.readouterr().out.strip()
        assert stop_id.startswith("stp_")

        refused = await agent.first("stopped", started_after=0.0, within=BOUND_S)
        assert refused.ended - returned < BOUND_S
        assert refused.stop_id == stop_id
        # Every call started after the refusal is refused too, and none reaches the upstream.
        served_before = sum(demo.served.values())
        await anyio.sleep(0.2)
        later = [o for o in agent.outcomes if o.started >= refused.ended]
        assert later and all((o.code, o.stop_id) == ("stopped", stop_id) for o in later)
        assert sum(demo.served.values()) == served_before

        assert await cli("clear", stop_id, "--reason", "refunds fixed", *operator) == 0
        cleared = anyio.current_time()
        assert f"cleared {stop_id} (agent:ops-bot)" in capsys.readouterr().out
        # Service resumes on the same MCP connection, again well within the heartbeat.
        served = await agent.first(None, started_after=cleared, within=BOUND_S)
        assert served.ended - cleared < BOUND_S
        assert sum(demo.served.values()) > served_before
        tg.cancel_scope.cancel()
