"""The gateway's readiness (issue 12, point 7): ``/readyz`` 503 until its upstreams are connected
and its stops replayed, and again while it fails closed; ``/healthz`` only says it is alive.

``haltwire gateway`` binds its port before its upstreams and its watch are in: a load balancer
or an orchestrator that took the open port (or ``/healthz``) for readiness sent calls to a
gateway that could not serve them. Real processes and a real HTTP client here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
import tomli_w
from starlette.types import ASGIApp, Receive, Scope, Send

from control_harness import config_dict as control_dict
from haltwire.control import create_app, parse_control_config
from haltwire.demo.upstream import DemoUpstream
from haltwire.serve import serving
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from ports import free_port
from stops_harness import code_of, control_plane, gateway_config, until

pytestmark = pytest.mark.anyio


class Gate:
    """An ASGI app whose requests to ``paths`` wait until the gate opens (a server that accepts
    connections and answers nothing yet, as one starting or overloaded does)."""

    def __init__(self, app: ASGIApp, *paths: str) -> None:
        self.app, self.paths, self.opened = app, paths, anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            await self.opened.wait()
        await self.app(scope, receive, send)


async def probe(http: httpx2.AsyncClient, path: str = "/readyz") -> tuple[int, Any]:
    r = await http.get(path)
    return r.status_code, r.json()


async def test_the_gateway_is_ready_only_once_its_stops_and_upstreams_are_in(tmp_path: Path) -> None:
    data = control_dict({"backend": "sqlite", "path": str(tmp_path / "control.db")}, 0.2)
    control = Gate(create_app(parse_control_config(data)), "/v1/watch")
    demo = DemoUpstream()
    upstream = Gate(demo.http_app(), "/mcp")
    port = free_port()
    async with (
        serving(control, graceful_s=1) as cp,
        serving(upstream) as up,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http,
    ):
        config = gateway_config(up, cp)
        config["gateway"]["port"] = port
        config["control"]["staleness_s"] = 10.0  # the held watch is a silent one: not for 10 s
        config["upstreams"][0]["connect_timeout_s"] = 60
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(config))
        argv = [sys.executable, "-m", "haltwire", "gateway", "--config", str(path)]
        async with await anyio.open_process(argv) as gateway, anyio.create_task_group() as tg:
            try:

                async def answers() -> bool:
                    try:
                        return (await http.get("/healthz")).status_code == 200
                    except httpx2.TransportError:
                        return False

                await until(answers, within=30)  # alive: the process answers while it starts
                status, body = await probe(http)
                assert (status, body["ready"]) == (503, False), body
                assert body["not_ready"] == [
                    "the gateway is starting",
                    "upstream demo is not connected",
                    "the control plane's stops are not replayed yet",
                ]
                # A call that comes now waits for the start instead of a wrong answer.
                answered = anyio.Event()

                async def call() -> None:
                    async with connect(f"http://127.0.0.1:{port}/mcp", TOKENS["ops-bot"]) as ops:
                        assert await code_of(ops) is None
                    answered.set()

                tg.start_soon(call)
                control.opened.set()

                async def upstream_left() -> bool:
                    status, body = await probe(http)
                    return status == 503 and body["not_ready"] == [
                        "the gateway is starting",
                        "upstream demo is not connected",
                    ]

                await until(upstream_left, within=10)
                assert not answered.is_set()
                upstream.opened.set()

                async def ready() -> bool:
                    return await probe(http) == (200, {"ready": True})

                await until(ready, within=10)
                with anyio.fail_after(10):
                    await answered.wait()
                assert await probe(http, "/healthz") == (200, {"ok": True})
                gateway.terminate()  # SIGTERM: a clean stop
                with anyio.fail_after(15):
                    assert await gateway.wait() == 0
            finally:
                if gateway.returncode is None:
                    gateway.kill()
        assert sum(demo.served.values()) == 1


async def test_a_call_that_waited_for_a_start_that_failed_is_answered_503(tmp_path: Path) -> None:
    upstream = Gate(DemoUpstream().http_app(), "/mcp")  # never opened: the start times out
    port = free_port()
    async with (
        serving(upstream, graceful_s=1) as up,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        config = config_dict(up)
        config["gateway"]["port"] = port
        config["upstreams"][0]["connect_timeout_s"] = 4
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(config))
        argv = [sys.executable, "-m", "haltwire", "gateway", "--config", str(path)]
        async with await anyio.open_process(argv) as gateway:
            try:

                async def answers() -> bool:
                    try:
                        return (await http.get("/readyz")).status_code == 503
                    except httpx2.TransportError:
                        return False

                await until(answers, within=30)
                headers = {"Authorization": f"Bearer {TOKENS['ops-bot']}", "Accept": "application/json"}
                r = await http.post(
                    "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
                )
                assert r.status_code == 503 and r.json()["error"]["code"] == "not_started", r.text
                with anyio.fail_after(15):
                    assert await gateway.wait() == 2
                assert gateway.stderr is not None
                said = b"".join([chunk async for chunk in gateway.stderr]).decode()
                assert said.startswith("haltwire gateway: upstream 'demo'") and "did not start" in said, said
            finally:
                if gateway.returncode is None:
                    gateway.kill()


async def test_a_gateway_failing_closed_is_not_ready_until_the_control_plane_is_back(
    tmp_path: Path,
) -> None:
    db = tmp_path / "control.db"
    stop_first = anyio.Event()

    async def first(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with control_plane(db) as url:
            task_status.started(url)
            await stop_first.wait()

    async with running_upstream() as (_, up), anyio.create_task_group() as tg:
        cp = await tg.start(first)
        port = int(cp.rsplit(":", 1)[1])
        async with running_gateway(gateway_config(up, cp)) as (_, url):
            base = url.removesuffix("/mcp")
            async with httpx2.AsyncClient(base_url=base, timeout=5) as http:
                assert await probe(http) == (200, {"ready": True})
                stop_first.set()

                async def stale() -> bool:
                    return (await probe(http))[0] == 503

                await until(stale, within=10)
                status, body = await probe(http)
                assert body == {
                    "ready": False,
                    "not_ready": [
                        "nothing heard from the control plane for over 1 s: every call is refused "
                        "registry_unreachable"
                    ],
                }
                async with control_plane(db, port=port):

                    async def ready() -> bool:
                        return await probe(http) == (200, {"ready": True})

                    await until(ready, within=10)
