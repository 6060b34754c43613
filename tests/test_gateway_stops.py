"""The gateway enforces the control plane's stops: real control plane, real gateway, real MCP client."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.abc
import pytest

from harness import TOKENS, connect, running_gateway, running_upstream
from stops_harness import (
    STALENESS_S,
    clear,
    code_of,
    control_plane,
    gateway_config,
    issue,
    until,
)

pytestmark = pytest.mark.anyio

# ops-bot: tenant acme, version 1.0; billing-bot: tenant acme, version 2.0.
CASES = [
    # scope, (agent, tool) pairs refused, (agent, tool) pairs still served
    ("agent:ops-bot", [("ops-bot", "lookup_order")], [("billing-bot", "lookup_order")]),
    ("tool:lookup_order", [("ops-bot", "lookup_order"), ("billing-bot", "lookup_order")], []),
    ("version:billing-bot@2.0", [("billing-bot", "lookup_order")], [("ops-bot", "lookup_order")]),
    ("tenant:acme", [("ops-bot", "lookup_order"), ("billing-bot", "lookup_order")], []),
    ("global", [("ops-bot", "lookup_order"), ("billing-bot", "lookup_order")], []),
]


@pytest.mark.parametrize(("scope", "refused", "served"), CASES, ids=[c[0] for c in CASES])
async def test_a_stop_refuses_exactly_its_scope_and_clearing_restores_service(
    tmp_path: Path, scope: str, refused: list[tuple[str, str]], served: list[tuple[str, str]]
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway(gateway_config(up, cp)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as ops,
        connect(url, TOKENS["billing-bot"]) as billing,
    ):
        clients = {"ops-bot": ops, "billing-bot": billing}
        assert await code_of(ops) is None

        stop = await issue(cp, scope, "refund storm")
        first_agent, first_tool = refused[0]

        async def refused_now() -> bool:
            return await code_of(clients[first_agent], first_tool) == "stopped"

        await until(refused_now)
        before = dict(demo.served)
        for agent, tool in refused:
            result = await clients[agent].call_tool(tool, {"order_id": "A-1"})
            assert result.is_error
            error = (result.structured_content or {})["error"]
            assert error["code"] == "stopped" and error["retryable"] is False
            assert (error["scope"], error["stop_id"], error["reason"]) == (
                scope,
                stop["stop_id"],
                "refund storm",
            )
        assert dict(demo.served) == before, "a stopped call reaches no upstream"
        for agent, tool in served:
            assert await code_of(clients[agent], tool) is None

        await clear(cp, stop["stop_id"])

        async def served_again() -> bool:
            return await code_of(clients[first_agent], first_tool) is None

        await until(served_again)  # on the same MCP connection, no reconnect


async def test_losing_the_control_plane_fails_closed_and_its_return_restores_every_stop(
    tmp_path: Path,
) -> None:
    db = tmp_path / "control.db"
    stop_first = anyio.Event()

    async def first_plane(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with control_plane(db) as url:
            task_status.started(url)
            await stop_first.wait()

    async with running_upstream() as (_, up), anyio.create_task_group() as tg:
        cp = await tg.start(first_plane)
        port = int(cp.rsplit(":", 1)[1])
        stop = await issue(cp, "agent:billing-bot")
        async with (
            running_gateway(gateway_config(up, cp)) as (_, url),
            connect(url, TOKENS["ops-bot"]) as ops,
            connect(url, TOKENS["billing-bot"]) as billing,
        ):
            # Issued before the gateway started: held from its first call.
            assert await code_of(billing) == "stopped"
            assert await code_of(ops) is None

            stop_first.set()  # the control plane goes away
            gone = anyio.current_time()

            async def unreachable() -> bool:
                return await code_of(ops) == "registry_unreachable"

            await until(unreachable, within=STALENESS_S + 3.0)
            assert anyio.current_time() - gone < STALENESS_S + 3.0
            assert await code_of(billing) == "registry_unreachable"

            async with control_plane(db, port=port):

                async def served_again() -> bool:
                    return await code_of(ops) is None

                await until(served_again, within=10.0)
                result = await billing.call_tool("lookup_order", {"order_id": "A-1"})
                error = (result.structured_content or {}).get("error", {})
                assert (error.get("code"), error.get("stop_id")) == ("stopped", stop["stop_id"])
