"""Several gateway processes enforcing one budget: through Redis exactly, in memory not at all.

Everything here is a real process on loopback: ``haltwire demo upstream`` processes,
``haltwire gateway`` processes, client processes running the official MCP client, and
Redis (the shared server under a unique key prefix, or a private ``redis-server`` that a
test kills and restarts). Every process is killed in the fixtures' teardown.

The fleet run (one module fixture, two tests) starts the client processes first, so
their imports overlap the gateways' start-up; each client then sends its share of the
1,000 calls to the Redis fleet and its share of another 1,000 to the memory fleet.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp.types import CallToolResult

from gateway_processes import (
    START_TIMEOUT_S,
    TOKEN,
    Gateway,
    Processes,
    budget_key,
    spawn_gateways,
    spawn_upstream,
    wait_ready,
)
from harness import connect
from ports import free_ports
from redis_process import RedisProcess, shared_prefix, unique_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

BUDGET = 100
GATEWAYS = 3
CLIENTS = 8
CALLS = 1000


# -- the client processes -------------------------------------------------------------------

# Imports only the MCP client (not haltwire, whose gateway imports would double the start-up
# cost); ``connect`` is ``haltwire.demo.stack.connect``, inlined.
CLIENT_SCRIPT = """
import json, os, sys, traceback
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def connect(url, token):
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=60.0)
    )
    async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
        yield client


async def run_phase(phase, index, token):
    # One client per gateway; call k goes to gateway (index + k) % n, so the eight clients
    # spread their calls round-robin over the gateways. One task per gateway.
    urls = phase["urls"]
    n = len(urls)
    out = {"ok": 0, "ok_by_gateway": [0] * n, "refused_by_gateway": [0] * n, "codes": {}}

    async def calls_to(g, client):
        for k in range(phase["calls"]):
            if (index + k) % n != g:
                continue
            try:
                r = await client.call_tool("lookup_order", {"order_id": f"c{index}-{k}"})
            except Exception as exc:
                code = f"exception:{type(exc).__name__}"
            else:
                if not r.is_error:
                    out["ok"] += 1
                    out["ok_by_gateway"][g] += 1
                    continue
                code = ((r.structured_content or {}).get("error") or {}).get("code", "no-code")
                if code == "budget_exhausted":
                    out["refused_by_gateway"][g] += 1
            out["codes"][code] = out["codes"].get(code, 0) + 1

    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connect(u, token)) for u in urls]
        async with anyio.create_task_group() as tg:
            for g, client in enumerate(clients):
                tg.start_soon(calls_to, g, client)
    return out


async def main(spec):
    results = {}

    async def one(name, phase):
        results[name] = await run_phase(phase, spec["index"], spec["token"])

    async with anyio.create_task_group() as tg:
        for name, phase in spec["phases"].items():
            tg.start_soon(one, name, phase)
    return results


# The launcher imports once, waits for "go", then forks one process per client (a fresh
# process each, with its own event loop and connections; the parent never ran a loop).
# Importing the MCP client costs more CPU than a client's 125 calls; once is enough.
launch = json.loads(sys.argv[1])
print("imported", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
children = []
for index in range(launch["clients"]):
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            spec = {"index": index, "token": launch["token"], "phases": {
                name: {"urls": phase["urls"], "calls": phase["calls"][index]}
                for name, phase in launch["phases"].items()
            }}
            line = json.dumps({"index": index, "results": anyio.run(main, spec)}) + "\\n"
            os.write(1, line.encode())  # one write of under PIPE_BUF bytes: never interleaved
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    children.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in children))
"""


def read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().decode().strip() if ready else ""


@dataclass
class PhaseResult:
    ok: int = 0
    ok_by_gateway: list[int] = field(default_factory=lambda: [0] * GATEWAYS)
    refused_by_gateway: list[int] = field(default_factory=lambda: [0] * GATEWAYS)
    codes: Counter[str] = field(default_factory=Counter)
    upstream_served: int = 0
    #: The budget counter in Redis after the run (Redis fleet only).
    counted: int | None = None


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    procs = Processes(tmp_path_factory.mktemp("fleet"))
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def fleet_run(module_procs: Processes) -> Iterator[dict[str, PhaseResult]]:
    """1,000 calls from 8 client processes to 3 gateways sharing Redis, and 1,000 to 3 counting in memory."""
    procs = module_procs
    with shared_prefix("hwtest-fleet") as (redis_url, prefix):
        upstreams = {b: spawn_upstream(procs, f"upstream-{b}") for b in ("redis", "memory")}
        # Pick every port now, so the clients can start (and import) while the servers do.
        picked = free_ports(GATEWAYS * len(upstreams))
        gateway_ports = {b: picked[i * GATEWAYS : (i + 1) * GATEWAYS] for i, b in enumerate(upstreams)}
        script = procs.logs / "client.py"
        script.write_text(CLIENT_SCRIPT)
        shares = [CALLS // CLIENTS + (1 if i < CALLS % CLIENTS else 0) for i in range(CLIENTS)]
        launch = {
            "clients": CLIENTS,
            "token": TOKEN,
            "phases": {
                b: {"urls": [f"http://127.0.0.1:{p}/mcp" for p in ports], "calls": shares}
                for b, ports in gateway_ports.items()
            },
        }
        clients = procs.spawn(
            "clients",
            [sys.executable, str(script), json.dumps(launch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # the forked clients share its process group; teardown kills the group
        )

        for up in upstreams.values():
            wait_ready(procs, up.name, f"http://127.0.0.1:{up.port}/state")
        gateways: list[Gateway] = []
        for b, ports in gateway_ports.items():
            gateways += spawn_gateways(
                procs, b, GATEWAYS, ports=ports, upstream=upstreams[b], backend=b, redis_url=redis_url, prefix=prefix
            )
        for gw in gateways:
            wait_ready(procs, gw.name, gw.readyz)
        if read_line(clients, START_TIMEOUT_S) != "imported":
            pytest.fail(f"the clients did not start:\n{procs.log_tail('clients')}")

        before = {b: up.total_served() for b, up in upstreams.items()}
        try:
            out, _ = clients.communicate(b"go\n", timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the clients did not finish within 90 s:\n{procs.log_tail('clients')}")
        assert clients.returncode == 0, procs.log_tail("clients")
        reports = [json.loads(line) for line in out.decode().splitlines()]
        assert sorted(r["index"] for r in reports) == list(range(CLIENTS)), "one report per client"
        results = {b: PhaseResult() for b in upstreams}
        for report in reports:
            for b, phase in report["results"].items():
                r = results[b]
                r.ok += phase["ok"]
                r.ok_by_gateway = [
                    x + y for x, y in zip(r.ok_by_gateway, phase["ok_by_gateway"], strict=True)
                ]
                r.refused_by_gateway = [
                    x + y for x, y in zip(r.refused_by_gateway, phase["refused_by_gateway"], strict=True)
                ]
                r.codes.update(phase["codes"])
        for b, up in upstreams.items():
            results[b].upstream_served = up.total_served() - before[b]
        # Nothing is in flight any more: the shared counter holds exactly what was admitted.
        raw = redis.Redis.from_url(redis_url)
        try:
            counted = raw.get(budget_key(prefix))
        finally:
            raw.close()
        results["redis"].counted = int(counted or 0)
        yield results


# -- the fleet ------------------------------------------------------------------------------


def test_three_gateways_sharing_redis_serve_exactly_the_budget(fleet_run: dict[str, PhaseResult]) -> None:
    r = fleet_run["redis"]
    assert r.ok == BUDGET, f"clients saw {r.ok} results for a budget of {BUDGET}: {r.codes}"
    assert r.upstream_served == BUDGET, "the upstream served more (or fewer) calls than the budget"
    assert r.counted == BUDGET, "every admitted call, and no other, is counted in Redis"
    assert dict(r.codes) == {"budget_exhausted": CALLS - BUDGET}, "every other call is a budget refusal"
    # Round-robin, each gateway answered about a third of the calls; each refused all it did not
    # serve, so each one saw the shared budget run out.
    answered = [ok + refused for ok, refused in zip(r.ok_by_gateway, r.refused_by_gateway, strict=True)]
    assert sum(answered) == CALLS
    assert all(n >= CALLS // GATEWAYS - 1 for n in answered), answered


def test_three_gateways_counting_in_memory_serve_three_budgets(fleet_run: dict[str, PhaseResult]) -> None:
    """The failure mode, on purpose: each gateway enforces the budget alone."""
    r = fleet_run["memory"]
    assert r.ok_by_gateway == [BUDGET] * GATEWAYS
    assert r.ok == GATEWAYS * BUDGET == 300
    assert r.upstream_served == 300
    assert dict(r.codes) == {"budget_exhausted": CALLS - GATEWAYS * BUDGET}


# -- Redis down mid-run ---------------------------------------------------------------------


def outcome(result: CallToolResult) -> str:
    if not result.is_error:
        return "ok"
    error = (result.structured_content or {}).get("error") or {}
    return f"{error.get('code')}:retryable={error.get('retryable')}"


DOWN = "counters_unavailable:retryable=True"


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.anyio
async def test_while_redis_is_down_every_call_is_refused_and_none_is_served_then_service_resumes(
    procs: Processes, private_server: RedisProcess
) -> None:
    server = private_server
    prefix = unique_prefix("hwtest-down")
    up = spawn_upstream(procs, "upstream")
    await anyio.to_thread.run_sync(wait_ready, procs, up.name, f"http://127.0.0.1:{up.port}/state")
    gateways = spawn_gateways(
        procs,
        "down",
        GATEWAYS,
        upstream=up,
        backend="redis",
        redis_url=server.url,
        prefix=prefix,
        budget=10_000,
        extra_limits="max_in_flight = 20",
    )
    for gw in gateways:
        await anyio.to_thread.run_sync(wait_ready, procs, gw.name, gw.readyz)

    raw = redis.Redis.from_url(server.url, socket_timeout=1)

    def counted() -> int:
        return int(raw.get(budget_key(prefix)) or 0)

    async def served() -> int:
        return await anyio.to_thread.run_sync(up.total_served)

    async def call(client: Any, tag: str) -> str:
        return outcome(await client.call_tool("lookup_order", {"order_id": tag}))

    try:
        async with (
            connect(gateways[0].url, TOKEN) as c0,
            connect(gateways[1].url, TOKEN) as c1,
            connect(gateways[2].url, TOKEN) as c2,
        ):
            clients = [c0, c1, c2]
            # Up: every gateway serves, and Redis counts each call served.
            assert [await call(c, "up") for c in clients for _ in range(3)] == ["ok"] * 9
            assert await served() == 9
            assert counted() == 9

            # A steady stream of calls, over all gateways, while Redis is killed.
            log: list[tuple[float, str]] = []
            stop = anyio.Event()

            async def stream() -> None:
                k = 0
                while not stop.is_set():
                    started = time.monotonic()
                    log.append((started, await call(clients[k % GATEWAYS], f"bg-{k}")))
                    k += 1
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(stream)
                with anyio.fail_after(20):
                    while sum(o == "ok" for _, o in log) < 5:
                        await anyio.sleep(0.01)
                await anyio.to_thread.run_sync(server.stop)
                killed_at = time.monotonic()
                # Once every gateway has refused, nothing admitted before the kill is in flight.
                for c in clients:
                    assert await call(c, "down-probe") == DOWN
                with anyio.fail_after(10):
                    while not any(t > killed_at and o == DOWN for t, o in log):
                        await anyio.sleep(0.01)
                await anyio.sleep(0.05)
                served_when_down = await served()
                refusals = [await call(c, "down") for c in clients for _ in range(10)]
                await anyio.sleep(0.5)  # the stream keeps calling while Redis stays down
                stop.set()
            assert refusals == [DOWN] * 30
            after_kill = [o for t, o in log if t > killed_at]
            assert after_kill, "the stream kept calling while Redis was down"
            assert set(after_kill) == {DOWN}, Counter(after_kill)
            assert any(o == "ok" for t, o in log if t < killed_at), "the stream was served before the kill"
            assert await served() == served_when_down, "a call was served while Redis was down"

            # Back on the same port, empty (no persistence): the next call to each gateway is served.
            await anyio.to_thread.run_sync(server.start)
            assert [await call(c, "back") for c in clients] == ["ok"] * GATEWAYS
            assert await served() == served_when_down + GATEWAYS
            assert counted() == GATEWAYS
    finally:
        raw.close()
