"""Gateways on a real Redis Cluster (three masters on loopback, ``redis_cluster``): one budget
across three gateway processes, tripwires counted across identities on other masters, and a
master killed mid-run (its identities refused, fail closed; the others served; then back).

Where the keys live (fixed by their names): acme/ops-bot@1.0 on the second master,
acme/billing-bot@2.0 on the first, the tenant acme/* and default/fleet-bot@0 on the third.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import anyio
import pytest
from mcp import Client

from cluster_harness import DOWN, call, counters
from gateway_processes import TOKEN, Processes, budget_key, spawn_gateways, spawn_upstream, wait_ready
from haltwire.identity import Identity
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from leases_harness import LEASES
from redis_cluster import RedisClusterProcesses, redis_cluster
from redis_process import unique_prefix

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

OPS = Identity("ops-bot", "acme", "1.0")
BILLING = Identity("billing-bot", "acme", "2.0")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.mark.slow
async def test_three_gateway_processes_on_the_cluster_serve_exactly_the_budget(
    cluster: RedisClusterProcesses, procs: Processes
) -> None:
    budget, calls, clients = 40, 120, 6
    prefix = unique_prefix("hwtest-cluster")
    up = spawn_upstream(procs, "upstream")
    await anyio.to_thread.run_sync(wait_ready, procs, up.name, f"http://127.0.0.1:{up.port}/state")
    gateways = spawn_gateways(
        procs, "cluster", 3, upstream=up, backend="redis", redis_url=cluster.urls, cluster=True,
        prefix=prefix, budget=budget,
    )
    for gw in gateways:
        await anyio.to_thread.run_sync(wait_ready, procs, gw.name, gw.readyz)
    before = await anyio.to_thread.run_sync(up.total_served)
    seen: Counter[str] = Counter()

    async def client(k: int) -> None:
        async with connect(gateways[k % 3].url, TOKEN) as c:
            for _ in range(calls // clients):
                seen[await call(c)] += 1

    async with anyio.create_task_group() as tg:
        for k in range(clients):  # two clients per gateway, all at once
            tg.start_soon(client, k)
    assert seen == {"ok": budget, "budget_exhausted": calls - budget}, [procs.log_tail(g.name) for g in gateways]
    assert await anyio.to_thread.run_sync(up.total_served) - before == budget, "zero overshoot"
    raw = cluster.client()
    try:
        assert int(raw.get(budget_key(prefix)) or 0) == budget, "every admitted call, and no other, counted"
    finally:
        raw.close()


async def test_a_tenant_rate_across_identities_on_other_masters_allows_exactly_its_limit(
    cluster: RedisClusterProcesses,
) -> None:
    """Three gateways, two identities (each on its own master), one tenant count on a third."""
    limit, runs = 12, 30
    rules = [
        {"name": "tenant-rate", "kind": "rate", "per": "tenant", "limit": limit, "window_s": 3600.0},
        {"name": "steps", "kind": "steps", "limit": 5},
        {"name": "same", "kind": "repeated_calls", "in_a_row": 5},
    ]
    async with running_upstream() as (demo, up):
        data = config_dict(up, leases=LEASES, tripwires=rules, counters=counters(cluster, unique_prefix("hwtest-cluster")))
        async with (
            running_gateway(data) as (_, g0),
            running_gateway(data) as (_, g1),
            running_gateway(data) as (_, g2),
        ):
            urls = [g0, g1, g2]
            before = demo.served["lookup_order"]
            seen: Counter[str] = Counter()

            async def one(k: int) -> None:
                agent = ("ops-bot", "billing-bot")[k % 2]
                async with connect(urls[k % 3], TOKENS[agent]) as c:
                    seen[await call(c, agent, f"run-{k}")] += 1

            async with anyio.create_task_group() as tg:
                for k in range(runs):
                    tg.start_soon(one, k)
            assert seen == {"ok": limit, "tripwire_tripped": runs - limit}
            assert demo.served["lookup_order"] - before == limit, "zero overshoot"


async def test_an_outcome_trip_held_on_a_tenant_refuses_its_other_identities_at_another_gateway(
    cluster: RedisClusterProcesses,
) -> None:
    """ops-bot trips a tenant-wide rule at one gateway; billing-bot (another master) is refused at
    another by the hold on the tenant (a third master), before any stop could have reached it."""
    rules = [{"name": "two-errors", "kind": "policy_hits", "in_a_row": 2, "scope": "tenant"}]
    async with running_upstream() as (_, up):
        data = config_dict(up, leases=LEASES, tripwires=rules, counters=counters(cluster, unique_prefix("hwtest-cluster")))
        async with (
            running_gateway(data) as (_, first),
            running_gateway(data) as (_, second),
            connect(first, TOKENS["ops-bot"]) as a,
            connect(second, TOKENS["billing-bot"]) as b,
        ):
            assert await call(b, "billing-bot", "run-b") == "ok"
            assert [await call(a, "ops-bot", "run-a", "fail") for _ in range(2)] == ["error", "error"]
            assert await call(b, "billing-bot", "run-b") == "tripwire_tripped"


async def test_a_master_killed_mid_run_refuses_its_identities_serves_the_others_then_serves_them_again(
    cluster: RedisClusterProcesses,
) -> None:
    """Two streams of calls, ops-bot's and billing-bot's (a budget of 30 each, on two masters).
    ops-bot's master is killed (SIGKILL) mid-run: from then on its calls are refused
    ``counters_unavailable`` (retryable) and none reaches the upstream, while billing-bot's are
    served. The master restarts on its port with its nodes.conf and AOF: ops-bot is served again,
    up to its budget and not past it: nothing counted was lost, nothing uncounted served (a call in
    flight at the kill may have been counted with its reply lost: refused, never served)."""
    budget = 30
    node = cluster.node_of(f"{{{OPS.counted_as}}}")
    assert node is not cluster.node_of(f"{{{BILLING.counted_as}}}")
    prefix = unique_prefix("hwtest-cluster")
    async with running_upstream() as (demo, up):
        data = config_dict(up, limits={"budget": budget}, counters={**counters(cluster, prefix), "timeout_s": 0.5})
        async with (
            running_gateway(data) as (_, url),
            connect(url, TOKENS["ops-bot"]) as ops,
            connect(url, TOKENS["billing-bot"]) as billing,
        ):
            log: dict[str, list[tuple[float, str]]] = {"ops": [], "billing": []}
            stop = anyio.Event()

            async def stream(name: str, client: Client) -> None:
                while not stop.is_set():
                    started = time.monotonic()
                    log[name].append((started, await call(client)))
                    await anyio.sleep(0.01)

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream, "ops", ops)
                    tg.start_soon(stream, "billing", billing)
                    with anyio.fail_after(20):
                        while sum(o == "ok" for _, o in log["ops"]) < 3:
                            await anyio.sleep(0.005)
                    await anyio.to_thread.run_sync(node.kill)
                    killed_at = time.monotonic()
                    with anyio.fail_after(10):
                        while sum(t > killed_at for t, _ in log["billing"]) < 5:
                            await anyio.sleep(0.01)
                    stop.set()
                ops_after = [o for t, o in log["ops"] if t > killed_at]
                billing_after = [o for t, o in log["billing"] if t > killed_at]
                assert ops_after and set(ops_after) == {DOWN}, Counter(ops_after)
                assert set(billing_after) == {"ok"}, Counter(billing_after)
                assert [await call(ops) for _ in range(3)] == [DOWN] * 3
                oks = sum(o == "ok" for name in log for _, o in log[name])
                assert demo.served["lookup_order"] == oks, "every call served was answered ok, and no other"
            finally:
                await anyio.to_thread.run_sync(cluster.restart, node)
            before_restart = [o for _, o in log["ops"]]
            after: list[str] = []
            with anyio.fail_after(20):
                while not after or after[-1] != "budget_exhausted":
                    after.append(await call(ops))
                    if after[-1] == DOWN:
                        await anyio.sleep(0.1)  # the master takes up its slots again
            assert set(after) <= {"ok", DOWN, "budget_exhausted"}, after
            assert "ok" in after, "served again"
            ok = before_restart.count("ok") + after.count("ok")
            assert budget - 1 <= ok <= budget, f"{ok} served for a budget of {budget}, across the kill"
            raw = cluster.client()
            try:
                assert int(raw.get(f"{prefix}:{{{OPS.counted_as}}}:b:{int(time.time() // 3600)}") or 0) == budget
            finally:
                raw.close()
