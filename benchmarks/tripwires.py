"""What the per-call tripwires cost at the gateway: the admission with and without them.

Run from the repository root::

    .venv/bin/python benchmarks/tripwires.py                   # memory, and Redis if it answers
    .venv/bin/python benchmarks/tripwires.py --redis redis://127.0.0.1:6379/0 --calls 5000
    .venv/bin/python benchmarks/tripwires.py --cluster                # and a private Redis Cluster

For each store (``MemoryCounters``; ``RedisCounters`` under a unique key prefix, deleted
afterwards) and each rule set (none; ``steps``; the four admission kinds; all six kinds; the five
rules of ``benchmarks/gateway.py``'s tripwires row, ``FIVE``, and the same with a content rule), one
call is what the pipeline does around its upstream: ``Tripwires.plan``, ``Ceilings.admit`` with
the plan's counts, ``Tripwires.judge``, ``Ticket.release``, ``Tripwires.settle`` on a result.
It prints p50/p99 in microseconds and the store's round trips per call (the ceilings here
hold a slot, so a call is an admission and a release: 2 without tripwires).

On a shared 2-core machine (2026-12-02, 2,000 calls): memory p50 8 us without rules, 25 us with
``steps``, 40 us with the four admission kinds, 61 us with all six; Redis p50 0.41 ms without,
0.48 ms with the admission kinds at the same 2 round trips per call (their counts go in the
admission's script), 0.76 ms and 3 round trips with all six (the outcome's judgement is one
more). The gateway benchmark's five: memory p50 56 us, 116 us with the content rule beside them
(the built-in detector on a short result), which is why that row has five.

``--cluster`` adds a Redis Cluster row per rule set: three ``redis-server`` masters on loopback,
started as the tests start them (``tests/redis_cluster.py``). Target: a call's round trips on the
cluster are Redis's, plus one per tenant- or agent-wide rule's owner (the identity's own counts
stay in its admission's one script); the benchmark exits 1 when a row misses it. Measured
(2026-12-03, 1,000 calls, load average 11 on 2 cores, so the times say little): 2.00 round trips
per call without rules and with ``steps`` (2.00 commands on the wire), 3.00 with the admission
kinds (their ``rate`` is per tenant: one more owner), 4.00 with all six and with the five (3.00
on one Redis), every row on target.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import redis

from haltwire.gateway.ceilings import Ceilings
from haltwire.gateway.config import parse_config
from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.store.counters import CounterStore
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.counters.redis import RedisCounters
from haltwire.tripwires.engine import Tripwires
from haltwire.tripwires.rules import TripwireRule

BIG = 10**12
RULES: dict[str, list[dict[str, Any]]] = {
    "none": [],
    "steps": [{"kind": "steps", "limit": BIG}],
    "admission kinds (4)": [
        {"kind": "steps", "limit": BIG},
        {"kind": "rate", "limit": BIG, "window_s": 3600, "per": "tenant"},
        {"kind": "money", "limit": BIG, "amount": "amount_cents"},
        {"kind": "repeated_calls", "in_a_row": 10**6},
    ],
}
RULES["all kinds (6)"] = [
    *RULES["admission kinds (4)"],
    {"kind": "policy_hits", "in_a_row": 10**6},
    {"kind": "repeated_results", "in_a_row": 10**6},
]
#: The five rules of ``benchmarks/gateway.py``'s "haltwire + 5 tripwires" row, as a deployment
#: would write them (limits far above what a benchmark run reaches, so none trips: the cost of
#: a rule does not depend on its limit). ``repeated_calls`` and ``policy_hits`` keep realistic
#: streaks: the benchmark's calls differ from one another and are all served.
FIVE: list[dict[str, Any]] = [
    {"name": "steps-per-run", "kind": "steps", "limit": BIG},
    {"name": "money-per-run", "kind": "money", "amount": "amount_cents", "limit": BIG},
    {
        "name": "calls-per-tenant",
        "kind": "rate",
        "per": "tenant",
        "scope": "run",
        "limit": BIG,
        "window_s": 60,
    },
    {"name": "denials-in-a-row", "kind": "policy_hits", "in_a_row": 3},
    {"name": "stuck", "kind": "repeated_calls", "in_a_row": 5},
]
RULES["gateway benchmark's five"] = [{k: v for k, v in r.items() if k != "name"} for r in FIVE]
RULES["the five + content"] = [*RULES["gateway benchmark's five"], {"kind": "content"}]
CONFIG = parse_config(
    {
        "gateway": {"development": True},
        "limits": {"budget": 10**9, "max_in_flight": 10**6},
        "upstreams": [{"name": "u", "url": "http://127.0.0.1:1/mcp"}],
    }
)
WHO = Identity("bench-bot", "acme", "1.0")


async def measure(store: CounterStore, rules: list[dict[str, Any]], calls: int) -> tuple[list[float], int]:
    """Per-call seconds, and the store's round trips over all calls (0 when it does not count them)."""
    parsed = [TripwireRule.model_validate({"name": f"r{i}", **r}) for i, r in enumerate(rules)]
    ceilings = Ceilings(CONFIG, store)
    tripwires = Tripwires(parsed, store) if parsed else None
    before = getattr(store, "round_trips", 0)
    seconds: list[float] = []
    for i in range(calls):
        arguments = {"order_id": f"A-{i}", "amount_cents": 5}
        started = time.perf_counter()
        plan = tripwires.plan(WHO, "issue_refund", "run-1", arguments) if tripwires else None
        assert not isinstance(plan, Refusal), plan
        ticket = await ceilings.admit(WHO, "issue_refund", "run-1", () if plan is None else plan.ops)
        assert not isinstance(ticket, Refusal), ticket
        if tripwires is not None and plan is not None:
            assert tripwires.judge(plan, ticket.tallied) is None
        await ticket.release()
        if tripwires is not None:
            await tripwires.settle(
                WHO, "issue_refund", "run-1", {"content": [{"type": "text", "text": f"ok {i}"}]}
            )
        seconds.append(time.perf_counter() - started)
    return seconds, getattr(store, "round_trips", 0) - before


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1e6


def redis_answers(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_timeout=1).ping()
    except (redis.RedisError, OSError):
        return False
    return True


async def cost(
    kind: str, rules: list[dict[str, Any]], calls: int, redis_url: str, cluster: Sequence[str] = ()
) -> tuple[list[float], int]:
    """``measure`` on a fresh store of ``kind`` (``memory``; ``redis``, or ``cluster`` on the
    nodes ``cluster``, under a unique prefix, deleted afterwards)."""
    prefix = f"bench-tripwires-{uuid.uuid4().hex[:8]}"
    store: CounterStore
    if kind == "memory":
        store = MemoryCounters()
    elif kind == "cluster":
        store = RedisCounters(list(cluster), prefix=prefix, timeout_s=5, cluster=True)
    else:
        store = RedisCounters(redis_url, prefix=prefix, timeout_s=5)
    try:
        return await measure(store, rules, calls)
    finally:
        await store.aclose()
        if kind != "memory":
            client: Any = (
                redis.RedisCluster.from_url(cluster[0]) if kind == "cluster" else redis.Redis.from_url(redis_url)
            )
            for key in list(client.scan_iter(f"{prefix}:*")):
                client.delete(key)
            client.close()


#: Commands the cluster client wrote to a node (``count_cluster_commands``): the round trips made.
SENT = [0]


def count_cluster_commands() -> None:
    """Count every command redis-py's cluster client sends to a node (redirects and slot maps too)."""
    from redis.asyncio.cluster import ClusterNode

    send = ClusterNode.execute_command

    async def counted(self: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        SENT[0] += 1
        return await send(self, *args, **kwargs)

    ClusterNode.execute_command = counted  # type: ignore[method-assign]


def extra_owners(rules: list[dict[str, Any]]) -> int:
    """The owners besides the identity a call's admission counts under on a cluster."""
    return len({r["per"] for r in rules if r["kind"] == "rate" and r.get("per", "run") != "run"})


@contextlib.contextmanager
def private_cluster() -> Iterator[list[str] | str]:
    """The node URLs of a three-master cluster started for the run, or why there is none."""
    if shutil.which("redis-server") is None:
        yield "no redis-server binary"
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from redis_cluster import redis_cluster

    with tempfile.TemporaryDirectory() as tmp, redis_cluster(Path(tmp)) as c:
        yield c.urls


async def run(opts: argparse.Namespace, cluster: list[str] | str | None) -> int:
    stores = ["memory"]
    if redis_answers(opts.redis):
        stores.append("redis")
    else:
        print(f"(Redis at {opts.redis} does not answer: memory only)")
    if isinstance(cluster, list):
        stores.append("cluster")
        count_cluster_commands()
    elif cluster is not None:
        print(f"(cluster skipped: {cluster})")
    trips_of: dict[tuple[str, str], float] = {}
    for kind in stores:
        for name, rules in RULES.items():
            sent = SENT[0]
            seconds, trips = await cost(kind, rules, opts.calls, opts.redis, cluster or ())
            trips_of[kind, name] = trips / opts.calls
            per_call = f", {trips / opts.calls:.2f} round trips per call" if kind != "memory" else ""
            if kind == "cluster":  # (the warm-up's slot map and script loads included)
                per_call += f" ({(SENT[0] - sent) / opts.calls:.2f} commands sent)"
            print(f"{kind:7} {name:26} p50 {p(seconds, 50):8.1f} us  p99 {p(seconds, 99):8.1f} us{per_call}")
    missed = 0
    if "cluster" in stores and "redis" in stores:
        print("target: round trips per call on the cluster = Redis's + one per tenant- or agent-wide owner")
        for name, rules in RULES.items():
            want = trips_of["redis", name] + extra_owners(rules)
            got = trips_of["cluster", name]
            ok = abs(got - want) < 1e-9
            missed += not ok
            print(f"  {name:26} cluster {got:.2f}, target {want:.2f}: {'met' if ok else 'MISSED'}")
    return 1 if missed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--cluster", action="store_true", help="also on a private three-master Redis Cluster")
    opts = parser.parse_args()
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(private_cluster()) if opts.cluster else None
        sys.exit(anyio.run(run, opts, cluster))


if __name__ == "__main__":
    main()
