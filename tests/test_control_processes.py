"""``haltwire control`` as two processes (``haltwire.control_processes``): the agents' listener
in a child of its own, the admin and enforcement listeners in the main process.

Everything is real: the command and its child, SIGSTOP, SIGKILL and SIGTERM, a gateway following
the enforcement listener, the official MCP client. The heartbeat is 30 s, so within ``BOUND_S``
only a push (and between the two processes, their wake-up path) can deliver a change.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from control_harness import TOKEN, Events, auth
from control_process import HEARTBEAT_S, LISTENERS, alive, control_command
from harness import TOKENS, config_dict, connect, postgres_section, running_gateway, running_upstream
from stops_harness import code_of

pytestmark = pytest.mark.anyio

#: Generous for a busy machine, and far below the heartbeat: only a push arrives this soon.
BOUND_S = 3.0
@contextmanager
def registry(backend: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if backend == "sqlite":
        yield {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    else:
        with postgres_section("test_processes") as section:
            yield section


@asynccontextmanager
async def watching(url: str, role: str) -> AsyncIterator[Events]:
    """A watch stream as ``role``, current (past its ``caught-up`` comment)."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(5, read=HEARTBEAT_S * 2)) as http:
        async with http.stream("GET", f"{url}/v1/watch", headers=auth(role)) as response:
            assert response.status_code == 200
            events = Events(response)
            assert await events.next() == {"comment": "caught-up"}
            yield events


async def issue(url: str, scope: str, role: str = "operator") -> str:
    async with httpx2.AsyncClient(base_url=url, timeout=BOUND_S) as http:
        r = await http.post("/v1/stops", json={"scope": scope, "reason": "runaway"}, headers=auth(role))
    assert r.status_code == 201, r.text
    stop_id: str = r.json()["stop_id"]
    return stop_id


async def until(probe: Callable[[], bool], within: float) -> None:
    with anyio.fail_after(within):
        while not probe():
            await anyio.sleep(0.05)


async def test_a_stop_is_answered_and_enforced_at_the_gateway_while_the_agents_process_is_frozen(
    tmp_path: Path,
) -> None:
    async with (
        control_command(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")}) as cp,
        running_upstream() as (_, upstream),
        running_gateway(
            config_dict(upstream, control={"url": cp.url("enforcement"), "token": TOKEN["gateway"]})
        ) as (_, gateway),
        connect(gateway, TOKENS["ops-bot"]) as client,
        watching(cp.url("agents"), "agent") as agents_watch,
    ):
        assert await code_of(client) is None
        (child,) = cp.children()
        os.kill(child, signal.SIGSTOP)  # as busy as an agent flood can make it: not at all
        try:
            with anyio.fail_after(BOUND_S):
                stop_id = await issue(cp.url("admin"), "global")
                while await code_of(client) != "stopped":
                    pass
        finally:
            os.kill(child, signal.SIGCONT)
        # The agents' process was woken while frozen; it pushes the stop once it runs again.
        event = await agents_watch.next_change(within=BOUND_S)
        assert event["event"] == "stop" and stop_id in event["data"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_stop_written_by_either_process_wakes_the_watchers_of_the_other(
    tmp_path: Path, backend: str
) -> None:
    with registry(backend, tmp_path) as section:
        async with (
            control_command(tmp_path, section) as cp,
            watching(cp.url("enforcement"), "gateway") as gateways,
            watching(cp.url("agents"), "agent") as agents,
        ):
            # Written by the main process (the admin listener): pushed by the child.
            first = await issue(cp.url("admin"), "global")
            assert first in (await agents.next_change(within=BOUND_S))["data"]
            assert first in (await gateways.next_change(within=BOUND_S))["data"]
            # Written by the child (an operator may still use the agents' port): pushed by the main one.
            second = await issue(cp.url("agents"), "agent:a1")
            assert second in (await gateways.next_change(within=BOUND_S))["data"]
            assert second in (await agents.next_change(within=BOUND_S))["data"]


async def test_a_gateway_that_follows_the_agents_listener_is_named_in_the_log(tmp_path: Path) -> None:
    async with control_command(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")}) as cp:
        async with watching(cp.url("enforcement"), "gateway"):
            pass
        assert "follows the watch" not in cp.log.read_text()
        for _ in range(2):
            async with watching(cp.url("agents"), "gateway"):
                pass
        named = "gateway gateway-1 follows the watch on the agents' listener"
        await until(lambda: named in cp.log.read_text(), within=BOUND_S)
        assert cp.log.read_text().count(named) == 1, "once per identity"


async def test_both_processes_publish_one_generated_broker_key(tmp_path: Path) -> None:
    async with control_command(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")}) as cp:
        async with httpx2.AsyncClient(timeout=5) as http:
            keys = [(await http.get(f"{cp.url(name)}/.well-known/jwks.json")).json() for name in LISTENERS]
        assert len(keys[0]["keys"]) == 1 and keys[0] == keys[1] == keys[2]


async def test_a_dead_agents_process_is_replaced_and_a_dead_main_process_takes_it_along(
    tmp_path: Path,
) -> None:
    async with control_command(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")}) as cp:
        (first,) = cp.children()
        os.kill(first, signal.SIGKILL)
        await until(lambda: len(cp.children()) == 2, within=10)
        await cp.answers("agents", within=10)
        second = cp.children()[1]
        assert second != first and alive(second)

        assert cp.proc is not None
        cp.proc.kill()  # SIGKILL: the main process cleans up nothing
        await cp.proc.wait()
        await until(lambda: not listening(cp.ports["agents"]), within=5)  # the child exited


async def test_sigterm_stops_the_agents_process_too(tmp_path: Path) -> None:
    async with control_command(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")}) as cp:
        (child,) = cp.children()
        assert cp.proc is not None
        cp.proc.terminate()
        with anyio.fail_after(20):
            assert await cp.proc.wait() == 0, "SIGTERM is a clean stop: exit 0, as the README says"
        assert not alive(child), "the main process waited for its child"


def listening(port: int) -> bool:
    """Whether anything accepts connections on ``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True
