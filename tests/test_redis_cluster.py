"""The Redis stores on a real Redis Cluster (three masters on loopback, ``redis_cluster``).

Each admission is one script per owner of its counters (``haltwire.store.counters.parts``): one
round trip for an identity's own counters; a tenant-wide count is a second script, on the
tenant's slot, and a refusal there gives back what the identity's part took. The identities
used here live on different masters from their tenant (the slots are fixed by their names):
acme/ops-bot@1.0 on the second master, acme/billing-bot@2.0 on the first, acme/* on the third.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
import redis
from redis.asyncio.cluster import NodesManager, RedisCluster
from redis.crc import key_slot

from haltwire.config import ConfigError
from haltwire.gateway import shared_redis
from haltwire.gateway.config import parse_config
from haltwire.identity import Identity, tenant_counted_as
from haltwire.store.counters import BudgetCounter, CountersUnavailable, Repeat, SlotCounter, Tally, TallyOp
from haltwire.store.counters.redis import RedisCounters
from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Recorded
from haltwire.store.idempotency.redis import RedisIdempotency
from harness import config_dict
from redis_cluster import ClusterNode, RedisClusterProcesses, redis_cluster
from redis_process import script_commands_since_reset, unique_prefix

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

OPS = Identity("ops-bot", "acme", "1.0")
BILLING = Identity("billing-bot", "acme", "2.0")
TENANT = tenant_counted_as("acme")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
async def stores(cluster: RedisClusterProcesses) -> AsyncIterator[list[RedisCounters]]:
    """Three stores on one fresh prefix, as three gateways would have."""
    prefix = unique_prefix("hwtest-cluster")
    made = [RedisCounters(cluster.urls, prefix=prefix, timeout_s=5.0, cluster=True) for _ in range(3)]
    try:
        yield made
    finally:
        for s in made:
            await s.aclose()


def test_the_identities_and_their_tenant_live_on_three_different_masters(cluster: RedisClusterProcesses) -> None:
    masters = {cluster.node_of(f"{{{k}}}").port for k in (OPS.counted_as, BILLING.counted_as, TENANT)}
    assert len(masters) == 3


async def test_an_identitys_counters_are_one_script_and_a_tenant_count_one_more(stores: list[RedisCounters]) -> None:
    store = stores[0]
    c = OPS.counted_as
    budgets = [BudgetCounter(f"{c}:b", 1, 10, 1e12), BudgetCounter(f"{c}:r:run-1", 0, 10, 1e12)]
    slots = [SlotCounter(f"{c}:f", 5)]
    own: list[TallyOp] = [Tally(f"{c}:steps:run:run-1", 1, 10, 60), Repeat(f"{c}:same:run:run-1", "d1", 60)]
    decision = await store.admit(budgets, slots, "s1", 1000.0, own)
    assert decision.admitted and decision.tallied == (1, 1)
    assert store.round_trips == 1, "one owner: one script, one round trip"
    tenant = Tally(f"{TENANT}:rate:0", 1, 10, 60)
    decision = await store.admit(budgets, slots, "s2", 1000.0, [*own, tenant])
    assert decision.admitted and decision.tallied == (2, 2, 1)
    assert store.round_trips == 3, "two owners: two scripts"
    await store.release(slots, "s1")
    await store.release(slots, "s2")


async def test_a_tenant_limit_shared_by_identities_on_other_masters_is_never_passed(
    stores: list[RedisCounters], cluster: RedisClusterProcesses
) -> None:
    """Three stores, two identities, 90 admissions at once against a tenant limit of 20: exactly
    20 admitted, and every refused call's identity budget given back."""
    limit = 20
    admitted: list[Identity] = []
    refused = 0

    async def one(k: int) -> None:
        nonlocal refused
        who = (OPS, BILLING)[k % 2]
        c = who.counted_as
        budget = BudgetCounter(f"{c}:b", 7, 1000, 1e12)
        decision = await stores[k % 3].admit(
            [budget], [], "", 1000.0, [Tally(f"{c}:steps:run:r{k}", 1, 5, 60), Tally(f"{TENANT}:rate:7", 1, limit, 60)]
        )
        if decision.admitted:
            admitted.append(who)
        else:
            assert decision.refused == ("tally", 1), "the tenant's count refused"
            assert decision.tallied == (0, limit), "as they were: nothing of the call counted"
            refused += 1

    async with anyio.create_task_group() as tg:
        for k in range(90):
            tg.start_soon(one, k)
    assert len(admitted) == limit and refused == 90 - limit
    raw = cluster.client()
    try:
        prefix = stores[0]._prefix
        assert int(raw.get(f"{prefix}:{{{TENANT}}}:t:rate:7") or 0) == limit
        for who in (OPS, BILLING):
            counted = int(raw.get(f"{prefix}:{{{who.counted_as}}}:b:7") or 0)
            assert counted == admitted.count(who), "a call refused by its tenant is not in its identity's budget"
    finally:
        raw.close()


async def test_a_refusal_by_a_held_tenant_puts_back_the_identitys_repeat_and_slot(
    stores: list[RedisCounters], cluster: RedisClusterProcesses
) -> None:
    store = stores[0]
    c = OPS.counted_as
    same = f"{c}:same:run:run-1"
    slot = SlotCounter(f"{c}:f", 1)
    hold = Tally(f"{TENANT}:hits:held:tenant%3Aacme", 0, 0, 1.0)
    for _ in range(2):
        assert (await store.admit([], [], "", 1000.0, [Repeat(same, "d1", 60), hold])).admitted
    assert (await store.tally([Tally(hold.key, 1, None, 30)], 1000.0)).values == (1,)  # the tenant is held
    decision = await store.admit([], [slot], "s9", 1000.0, [Repeat(same, "d2", 60), hold])
    assert decision.refused == ("tally", 1)
    assert decision.tallied == (2, 1), "the repeat as it was: d1 twice"
    raw = cluster.client()
    try:
        assert raw.get(f"{store._prefix}:{{{c}}}:t:{same.partition(':')[2]}") == b"d1:2"
        assert raw.zcard(f"{store._prefix}:{{{c}}}:f") == 0, "the slot is given back"
    finally:
        raw.close()
    # Its slot was given back: the only slot is free for the next call.
    assert (await store.admit([], [slot], "s10", 1000.0, [Repeat(same, "d1", 60)])).tallied == (3,)


async def test_tallies_across_owners_count_in_each(stores: list[RedisCounters]) -> None:
    """Usage counts (the identity's and its tenant's, no limit): one script per owner, all counted."""
    ops = [Tally(f"{OPS.counted_as}:usage:w1:in", 5, None, 60), Tally(f"{TENANT}:usage:w1:in", 5, None, 60)]
    assert (await stores[0].tally(ops, 1000.0)).values == (5, 5)
    more = [Tally(f"{BILLING.counted_as}:usage:w1:in", 7, None, 60), Tally(f"{TENANT}:usage:w1:in", 7, None, 60)]
    assert (await stores[1].tally(more, 1000.0)).values == (7, 12), "the tenant counts both identities"


async def test_idempotency_records_on_the_cluster(cluster: RedisClusterProcesses) -> None:
    prefix = unique_prefix("hwtest-cluster")
    a = RedisIdempotency(cluster.url, prefix=prefix, timeout_s=5.0, cluster=True)
    b = RedisIdempotency(cluster.urls[1:], prefix=prefix, timeout_s=5.0, cluster=True)
    try:
        keys = [f"{who.owner}:{n:064x}" for who in (OPS, BILLING) for n in range(3)]
        for key in keys:
            assert await a.begin(key, "f1", 0.0, 60) == FRESH
            assert await b.begin(key, "f1", 0.0, 60) == IN_FLIGHT, "claimed at the other gateway"
            assert await b.begin(key, "f2", 0.0, 60) == CONFLICT
            await a.complete(key, '{"ok": 1}')
            assert await b.begin(key, "f1", 0.0, 60) == Recorded('{"ok": 1}')
        await a.release(keys[0])
        assert await b.begin(keys[0], "f1", 0.0, 60) == Recorded('{"ok": 1}'), "a recorded outcome stays"
    finally:
        await a.aclose()
        await b.aclose()


async def test_started_stores_first_calls_are_one_script_each_on_their_master_alone(
    cluster: RedisClusterProcesses,
) -> None:
    """``start`` maps the slots and gives every master the scripts: the first admission and the
    first idempotency record after a gateway (re)starts are one EVALSHA each, on the master of
    their keys, with no map made and no NOSCRIPT within their deadlines."""
    raws = [node.client() for node in cluster.masters]
    prefix = unique_prefix("hwtest-cluster")
    counters = RedisCounters(cluster.url, prefix=prefix, timeout_s=5.0, cluster=True)
    records = RedisIdempotency(cluster.url, prefix=prefix, timeout_s=5.0, cluster=True)
    try:
        for raw in raws:
            raw.script_flush()  # as on masters that never saw these stores
        async with anyio.create_task_group() as tg:
            await counters.start(tg)
            await records.start(tg)
            for raw in raws:
                raw.config_resetstat()
            c = OPS.counted_as
            assert (await counters.admit([BudgetCounter(f"{c}:b", 1, 10, 1e12)], [], "", 1000.0)).admitted
            assert await records.begin(f"{OPS.owner}:{1:064x}", "f1", 0.0, 60) == FRESH
            seen = {
                node.port: script_commands_since_reset(raw) for node, raw in zip(cluster.masters, raws, strict=True)
            }
            expected: dict[int, dict[str, int]] = {node.port: {} for node in cluster.masters}
            for tag in (c, OPS.owner):  # the counters' owner, the records' agent
                calls = expected[cluster.node_of(f"{{{tag}}}").port]
                calls["evalsha"] = calls.get("evalsha", 0) + 1
            assert seen == expected, "each script on the master of its keys, nothing else anywhere"
            tg.cancel_scope.cancel()
    finally:
        for raw in raws:
            raw.close()
        await counters.aclose()
        await records.aclose()


async def test_keys_of_several_slots_in_one_script_are_refused_by_the_cluster_itself(
    cluster: RedisClusterProcesses,
) -> None:
    """Why the split matters: without it the cluster refuses the script (and the call fails closed)."""
    store = RedisCounters(cluster.url, prefix=unique_prefix("hwtest-cluster"), timeout_s=5.0, cluster=True)
    store.split = False
    try:
        with pytest.raises(Exception, match="slot"):
            await store.admit([BudgetCounter(f"{OPS.counted_as}:b", 1, 5, 1e12)], [], "", 1000.0, [
                Tally(f"{TENANT}:rate:1", 1, 5, 60)
            ])
    finally:
        await store.aclose()


def test_a_cluster_url_list_needs_cluster_mode() -> None:
    with pytest.raises(ValueError, match="cluster"):
        RedisCounters(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
    with pytest.raises(ValueError, match="database"):
        RedisCounters("redis://127.0.0.1:1/3", cluster=True)


def node_id(node: ClusterNode) -> str:
    c = node.client()
    try:
        return str(c.execute_command("CLUSTER", "MYID").decode())
    finally:
        c.close()


async def test_a_slot_moved_under_the_client_is_followed_and_counted_once(
    stores: list[RedisCounters], cluster: RedisClusterProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MOVED means the script did not run: the client follows it (no retry of a script that ran)."""
    store = stores[0]
    assert (await store.admit([BudgetCounter(f"{OPS.counted_as}:b", 1, 5, 1e12)], [], "", 1000.0)).admitted
    who = Identity("moved-bot", "acme", "1.0")  # a slot of its own, empty: it can be reassigned
    slot = key_slot(f"{{{who.counted_as}}}".encode())
    source = cluster.node_of(f"{{{who.counted_as}}}")
    target = next(n for n in cluster.nodes if n is not source)
    target_id = node_id(target)
    for node in cluster.nodes:
        c = node.client()
        try:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        finally:
            c.close()
    moves: list[object] = []
    move_slot = NodesManager.move_slot

    async def counted(self: NodesManager, e: Any) -> None:
        moves.append(e)
        await move_slot(self, e)

    monkeypatch.setattr(NodesManager, "move_slot", counted)
    try:
        budget = BudgetCounter(f"{who.counted_as}:b", 1, 5, 1e12)
        assert (await store.admit([budget], [], "", 1000.0)).admitted  # its map still says source
        assert len(moves) == 1, "one MOVED reply, followed"
        c = target.client()
        try:
            assert int(c.get(f"{store._prefix}:{{{who.counted_as}}}:b:1")) == 1, "counted once, where it lives now"
        finally:
            c.close()
    finally:
        source_id = node_id(source)
        c = cluster.client()
        try:
            c.delete(f"{store._prefix}:{{{who.counted_as}}}:b:1")
        finally:
            c.close()
        for node in cluster.nodes:
            c = node.client()
            try:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", source_id)
            finally:
                c.close()


async def test_clusterdown_fails_closed_within_the_timeout(cluster: RedisClusterProcesses) -> None:
    """With full coverage required (Redis's default), a master marked failed takes every key down:
    CLUSTERDOWN. Every admission is refused (CountersUnavailable) within the store's timeout."""
    store = RedisCounters(cluster.urls, prefix=unique_prefix("hwtest-cluster"), timeout_s=1.0, cluster=True)
    budget = BudgetCounter(f"{BILLING.counted_as}:b", 1, 5, 1e12)
    killed = cluster.node_of(f"{{{OPS.counted_as}}}")
    others = [n for n in cluster.nodes if n is not killed]
    try:
        assert (await store.admit([budget], [], "", 1000.0)).admitted
        for n in others:
            c = n.client()
            try:
                c.config_set("cluster-require-full-coverage", "yes")
            finally:
                c.close()
        await anyio.to_thread.run_sync(killed.kill)
        with anyio.fail_after(15):
            while True:  # until the others mark it failed
                c = others[0].client()
                try:
                    c.get(f"{{{BILLING.counted_as}}}")
                except redis.exceptions.ClusterDownError:  # CLUSTERDOWN The cluster is down
                    break
                finally:
                    c.close()
                await anyio.sleep(0.1)
        for _ in range(3):
            started = anyio.current_time()
            with pytest.raises(CountersUnavailable):
                await store.admit([budget], [], "", 1000.0)
            assert anyio.current_time() - started < 1.5
    finally:
        for n in others:
            c = n.client()
            try:
                c.config_set("cluster-require-full-coverage", "no")
            finally:
                c.close()
        if not killed.running:
            await anyio.to_thread.run_sync(cluster.restart, killed)
        await store.aclose()
    restored = RedisCounters(cluster.urls, prefix=unique_prefix("hwtest-cluster"), timeout_s=5.0, cluster=True)
    try:
        assert (await restored.admit([budget], [], "", 1000.0)).admitted, "served again"
    finally:
        await restored.aclose()


def test_the_gateway_config_names_a_cluster() -> None:
    data = config_dict("http://127.0.0.1:9", counters={"backend": "redis", "url": ["redis://127.0.0.1:7000"]})
    with pytest.raises(ConfigError, match="cluster"):
        parse_config(data)
    data["counters"]["cluster"] = True
    client = shared_redis(parse_config(data))
    assert isinstance(client, RedisCluster)
