"""A master of a Redis Cluster with replicas lost mid-run (``redis_cluster(replicas=1)``: three
masters, a replica of each, all on loopback, failed over after ``NODE_TIMEOUT_MS``): the gateway
fails closed on the lost master's keys until its replica has taken over, then serves them
again, with the same client, without a restart; the other masters' keys are served throughout.
A master is lost by a crash (SIGKILL: its connections reset) or a hang (SIGSTOP: its connections
open and silent, every call on it cut off by the counters' deadline). Each test leaves the
cluster whole again (the lost master restarted or thawed: a replica of its successor).

Where the keys live (fixed by their names): acme/ops-bot@1.0 on the second master,
acme/billing-bot@2.0 on the first, the tenant acme/* on the third (at start: a failover moves
them to its replica).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import anyio
import pytest

from cluster_harness import DOWN, CallStream, call, counters
from haltwire.identity import Identity, tenant_counted_as
from haltwire.store.counters import BudgetCounter, CountersUnavailable, SlotCounter, Tally
from haltwire.store.counters.redis import RedisCounters
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from redis_cluster import NODE_TIMEOUT_MS, RedisClusterProcesses, redis_cluster
from redis_process import unique_prefix

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

OPS = Identity("ops-bot", "acme", "1.0")
BILLING = Identity("billing-bot", "acme", "2.0")
TENANT = tenant_counted_as("acme")
#: The counters' deadline: an admission, wait included, takes no longer (then it is refused).
TIMEOUT_S = 0.5
#: The budget's window: one for the whole test (its key ends ``:b:1``).
WINDOW_S = 1e9


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    with redis_cluster(tmp_path_factory.mktemp("cluster"), replicas=1) as c:
        yield c


@pytest.mark.parametrize("how", ["killed", "frozen"])
async def test_a_master_lost_mid_run_fails_closed_until_its_replica_takes_over_then_serves(
    cluster: RedisClusterProcesses, how: str
) -> None:
    """Two streams of calls through one gateway, ops-bot's and billing-bot's (each on its own
    master). ops-bot's master is lost mid-run: killed (SIGKILL) or frozen (SIGSTOP; "the kill"
    below either way). Until its replica is promoted, every ops-bot call is refused
    ``counters_unavailable`` (retryable) within the counters' deadline and none reaches the
    upstream; billing-bot is served throughout. Once the replica has taken
    over, the same gateway serves ops-bot again, up to its budget and not past it: the promoted
    replica's count, plus every call admitted after the failover, is the budget. The count the
    replica held at the kill is read from it before its promotion: Redis replicates
    asynchronously, so what a failover can lose is what the master acknowledged and the replica
    had not received (here at most the call in flight). The old master, restarted (or thawed),
    comes back a replica of the new one, and its own data (its AOF) does not bring counts back."""
    budget = 300
    key = f"{{{OPS.counted_as}}}"
    master = cluster.serving(key)  # the second master at start; its old replica after a failover
    assert master is not None and master is not cluster.serving(f"{{{BILLING.counted_as}}}")
    replica = cluster.replica_of(master)
    prefix = unique_prefix("hwtest-failover")
    budget_key = f"{prefix}:{key}:b:1"
    limits = {"budget": budget, "window_s": WINDOW_S}
    async with running_upstream() as (demo, up):
        data = config_dict(up, limits=limits, counters=counters(cluster, prefix, TIMEOUT_S))
        async with (
            running_gateway(data) as (_, url),
            connect(url, TOKENS["ops-bot"]) as ops_client,
            connect(url, TOKENS["billing-bot"]) as billing_client,
        ):
            ops, billing = CallStream(ops_client), CallStream(billing_client)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ops.run)
                    tg.start_soon(billing.run)
                    with anyio.fail_after(20):
                        while ops.count("ok") < 5:
                            await anyio.sleep(0.005)
                    await anyio.to_thread.run_sync(master.kill if how == "killed" else master.freeze)
                    killed_at = time.monotonic()
                    await anyio.sleep(0.2)  # the replica reads what was sent to it before the kill
                    value, role = await anyio.to_thread.run_sync(replica.read, budget_key)
                    assert role == "slave", "read before its promotion (the node timeout is 1 s)"
                    at_kill = int(value or 0)
                    promoted = await anyio.to_thread.run_sync(cluster.wait_failed_over, key, master)
                    promoted_at = time.monotonic()
                    assert promoted is replica
                    with anyio.fail_after(10):
                        while not (oks := [c for c in ops.between(killed_at) if c.outcome == "ok"]):
                            await anyio.sleep(0.005)
                    served_again_at = oks[0].started
                    with anyio.fail_after(10):
                        while len(ops.between(served_again_at)) < 5:
                            await anyio.sleep(0.005)
                    ops.stop.set()
                    billing.stop.set()
                before = ops.between(0, killed_at)
                outage = ops.between(killed_at, served_again_at)
                after = ops.between(served_again_at)
                assert outage and {c.outcome for c in outage} == {DOWN}, Counter(c.outcome for c in outage)
                slowest = max(c.took_s for c in outage)
                assert slowest < TIMEOUT_S + 0.5, (
                    f"a refusal took {slowest:.2f} s: past the counters' deadline"
                )
                assert {c.outcome for c in after} == {"ok"}, Counter(c.outcome for c in after)
                assert served_again_at - killed_at > NODE_TIMEOUT_MS / 1000, "not before the kill was noticed"
                assert served_again_at - promoted_at < 1.0, (
                    "served again within a call or two of the failover"
                )
                billing_since = billing.between(killed_at)
                assert len(billing.between(killed_at, promoted_at)) >= 5, (
                    "billing-bot called during the outage"
                )
                assert {c.outcome for c in billing_since} == {"ok"}, Counter(c.outcome for c in billing_since)
                ok_before = sum(c.outcome == "ok" for c in before)
                ok_after = len(after)
                # The ops-bot calls that drive it to the end of its budget.
                rest: list[str] = []
                with anyio.fail_after(20):
                    while not rest or rest[-1] != "budget_exhausted":
                        rest.append(await call(ops_client))
                assert set(rest) == {"ok", "budget_exhausted"}, Counter(rest)
                ok_after += rest.count("ok")
                served = ops.count("ok") + billing.count("ok") + rest.count("ok")
                assert demo.served["lookup_order"] == served, (
                    "every call served was answered ok, and no other"
                )
                lost = ok_before - at_kill
                assert ok_after == budget - at_kill, (
                    f"after the failover: {ok_after} admitted on top of the replica's {at_kill} for {budget}"
                )
                assert lost <= 1, f"the failover lost {lost} counts acknowledged before the kill"
                value, role = await anyio.to_thread.run_sync(promoted.read, budget_key)
                assert role == "master" and int(value or 0) == budget
            finally:
                if not master.running:
                    await anyio.to_thread.run_sync(cluster.restart, master)
                elif how == "frozen":
                    master.thaw()
            # The old master is back as a replica of the promoted one: it took the promoted one's
            # count, not its own, and ops-bot's budget stays spent.
            await anyio.to_thread.run_sync(cluster.wait_replicating)
            await anyio.to_thread.run_sync(cluster.wait_ok)
            assert cluster.serving(key) is promoted
            value, role = await anyio.to_thread.run_sync(master.read, budget_key)
            assert role == "slave" and int(value or 0) == budget
            assert await call(ops_client) == "budget_exhausted"
            assert await call(billing_client) == "ok"


async def test_an_admission_whose_tenant_is_on_a_lost_master_gives_back_its_identitys_part(
    cluster: RedisClusterProcesses,
) -> None:
    """An admission in two parts (ops-bot's budget and slot, then its tenant's rate on another
    master). The tenant's master is killed: each admission is refused (``CountersUnavailable``)
    within the deadline, and what its first part took on ops-bot's master is given back. After
    the failover the same store admits again: the tenant's count is the replica's plus the new
    call, ops-bot's only what was admitted."""
    store = RedisCounters(
        cluster.urls, prefix=unique_prefix("hwtest-failover"), timeout_s=TIMEOUT_S, cluster=True
    )
    c = OPS.counted_as
    budget = BudgetCounter(f"{c}:b", 1, 100, 1e12)
    slot = SlotCounter(f"{c}:f", 100)
    rate = Tally(f"{TENANT}:rate:1", 1, 100, 600)
    tenant_master = cluster.serving(f"{{{TENANT}}}")
    assert tenant_master is not None and tenant_master is not cluster.serving(f"{{{c}}}")
    raw = cluster.client()
    try:
        assert (await store.admit([budget], [slot], "s0", 1000.0, [rate])).tallied == (1,)
        await anyio.to_thread.run_sync(cluster.wait_replicating)  # the replica has the tenant's 1
        await anyio.to_thread.run_sync(tenant_master.kill)
        killed_at = anyio.current_time()
        refused = 0
        with anyio.fail_after(20):
            while True:  # until the store finds the promoted replica
                started = anyio.current_time()
                try:
                    decision = await store.admit([budget], [slot], f"s{refused + 1}", 1000.0, [rate])
                    break
                except CountersUnavailable:
                    assert anyio.current_time() - started < TIMEOUT_S + 0.5, "refused within the deadline"
                    refused += 1
                    await anyio.sleep(0.05)
        assert anyio.current_time() - killed_at > NODE_TIMEOUT_MS / 1000, "not before a failover"
        promoted = await anyio.to_thread.run_sync(cluster.wait_failed_over, f"{{{TENANT}}}", tenant_master)
        assert promoted is not tenant_master and refused >= 5
        assert decision.admitted and decision.tallied == (2,), "the replica's count, plus this call"
        # Each refused call's budget and slot were given back: ops-bot holds the two admitted.
        assert int(raw.get(f"{store._prefix}:{{{c}}}:b:1") or 0) == 2
        admitted = [b"s0", f"s{refused + 1}".encode()]
        assert sorted(raw.zrange(f"{store._prefix}:{{{c}}}:f", 0, -1)) == admitted
    finally:
        raw.close()
        await store.aclose()
        if not tenant_master.running:
            await anyio.to_thread.run_sync(cluster.restart, tenant_master)


async def test_scripts_a_node_lacks_are_given_to_it_while_another_master_is_down(
    cluster: RedisClusterProcesses,
) -> None:
    """No node has the stores' scripts (a new cluster, or a replica just promoted) and a master is
    down: the identities whose keys live on the other masters are served all the same (each script
    goes to the node its keys name, not to every master), the lost master's refused."""
    lost = cluster.serving(f"{{{OPS.counted_as}}}")
    assert lost is not None and lost is not cluster.serving(f"{{{BILLING.counted_as}}}")
    for node in cluster.nodes:
        if node.answering:
            c = node.client()
            try:
                c.script_flush()
            finally:
                c.close()
    await anyio.to_thread.run_sync(lost.kill)
    # What is served and what is refused is the point here, not how fast: the first admission
    # maps the slots and gives the node its script (EVALSHA, then EVAL), which on a loaded CI
    # machine once took longer than TIMEOUT_S. A killed master refuses connections at once.
    store = RedisCounters(
        cluster.urls, prefix=unique_prefix("hwtest-failover"), timeout_s=4 * TIMEOUT_S, cluster=True
    )
    try:
        billing = BudgetCounter(f"{BILLING.counted_as}:b", 1, 10, 1e12)
        assert (await store.admit([billing], [], "", 1000.0)).admitted
        with pytest.raises(CountersUnavailable):
            await store.admit([BudgetCounter(f"{OPS.counted_as}:b", 1, 10, 1e12)], [], "", 1000.0)
        assert (await store.admit([billing], [], "", 1000.0)).admitted
    finally:
        await store.aclose()
        await anyio.to_thread.run_sync(cluster.wait_failed_over, f"{{{OPS.counted_as}}}", lost)
        await anyio.to_thread.run_sync(cluster.restart, lost)
