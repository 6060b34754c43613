"""What haltwire costs: the admission decision, and a ``tools/call`` through the gateway.

Run from the repository root::

    .venv/bin/python benchmarks/gateway.py            # full run, about 2-3 minutes
    .venv/bin/python benchmarks/gateway.py --quick    # a short run

It prints:

(a) the in-memory admission decision (``Ceilings.admit`` + ``Ticket.release`` on
    ``MemoryCounters``), p50/p99 in microseconds;
(b) the same on ``RedisCounters`` against ``--redis`` (a unique key prefix, deleted
    afterwards), with round trips per admission and per admit+release, both from the
    store's own counter and counted on the wire; and what the five rules add to a call in
    memory and in Redis (``benchmarks/tripwires.py``'s measurement);
(c) ``tools/call`` latency (p50/p99, one call at a time) and throughput (several concurrent
    callers) on loopback, with the official MCP client, going

    - ``direct``: straight to the demo upstream;
    - ``haltwire``: through the gateway (memory counters, limits too large to refuse);
    - ``haltwire+5tw``: the same with ``[leases]`` and five ``[[tripwires]]`` (steps and money
      per run, a rate per tenant, policy hits in a row, repeated calls: ``tripwires.FIVE``),
      the calls carrying a lease so that the run rules count them; its p50 against
      ``haltwire``'s is a target (at most 1.10x: the script exits 1 past it);
    - ``floor``: the least any Python gateway must do per call (``benchmarks/floor.py``: read the
      request's and the answer's JSON, forward the bytes; uvloop and httptools, callbacks only,
      no checks), so that haltwire's distance from direct splits into what Python costs and
      what haltwire adds;
    - ``bare``/``bare+schema``: a pass-through on the SDK's low-level ``Server`` with no checks,
      forwarding with one long-lived ``mcp.Client``; ``+schema`` supplies
      ``get_tool_input_schema`` (without it the SDK runs the server's own ``tools/list``
      handler before each call with arguments, to validate ``Mcp-Param-*`` headers);
    - ``fastmcp``: FastMCP's ``create_proxy`` over an already-connected client, with its
      ``RateLimitingMiddleware`` keyed by the caller's bearer token;
    - ``contextforge``: IBM ContextForge 1.1.0 on Python 3.12 from a venv of its own
      (``--contextforge-venv``), SQLite, its per-user rate limiter plugin on, the upstream
      registered as a gateway and exposed by a virtual server (``benchmarks/contextforge.py``);
      skipped, with the reason, when that venv is missing or broken;

    and how many upstream HTTP requests each ``tools/call`` cost. Each sessionless variant's
    throughput is measured a second time with a lean client (``benchmarks/lean_client.py``: raw
    JSON-RPC POSTs over kept-alive aiohttp connections), since the official client's own CPU
    bounds its throughput below what a fast server serves, with the server's CPU per call over
    those busy blocks ("loaded CPU") beside its CPU over the sequential calls ("server CPU",
    which includes waking from idle between calls).

Every server runs in its own process (the demo upstream, each proxy), and the client runs
in this one, so no two of them share an interpreter. The variants are interleaved in
rounds, in a rotating order, so a slow moment of the machine lands on all of them.

The "Targets" section lists what held: issue 18's ratios (haltwire over direct, for
sessionless and session-keeping clients; the gateway's CPU per call, sequential and loaded;
against FastMCP, throughput with both clients, and, when installed, ContextForge), the five
rules' cost, and what each call must cost the upstream. The script exits 1 when a target it
prints was missed.

The upstream is the demo upstream (``haltwire demo upstream``: ``DemoUpstream`` on uvicorn),
here under a thin ASGI wrapper that counts the HTTP requests it receives
(``GET /requests``); its own ``GET /state`` gives the tool calls it served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2

import contextforge
import tripwires as rule_cost
from floor import serve_floor
from gateway_clients import (
    _orders,
    latency_block,
    mcp_client,
    one_call,
    throughput_block,
    upstream_counts,
)
from gateway_common import (
    AGENT,
    AMOUNT_CENTS,
    HANDSHAKE,
    LEAN_VARIANTS,
    TOKEN,
    TOOL,
    TRIPWIRES,
    VARIANTS,
    AdmitStats,
    VariantStats,
)
from gateway_report import report_admission, report_calls, report_rule_cost
from gateway_servers import gateway_config, lease_token, serve_bare, serve_fastmcp, serve_upstream
from haltwire.serve import fast_loop
from lean_client import LeanClient
from procs import HOST, cpu_seconds, free_port, load_average, machine_speed, processes, spawn, wait_ready

SCRIPT = str(Path(__file__).resolve())
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# (a), (b): the admission decision
# --------------------------------------------------------------------------------------


async def _admit_loop(ceilings: Any, identity: Any, n: int) -> tuple[list[float], list[float]]:
    from haltwire.refusal import Refusal

    admit: list[float] = []
    both: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        ticket = await ceilings.admit(identity, TOOL)
        t1 = clock()
        if isinstance(ticket, Refusal):
            raise RuntimeError(f"the benchmark's ceilings refused a call: {ticket}")
        await ticket.release()
        t2 = clock()
        admit.append((t1 - t0) / 1000)
        both.append((t2 - t0) / 1000)
    return admit, both


def _ceilings(store: Any, *, slot_ttl_s: float = 300.0) -> tuple[Any, Any]:
    from haltwire.gateway.ceilings import Ceilings
    from haltwire.gateway.config import parse_config
    from haltwire.identity import Identity

    config = parse_config(
        {
            "gateway": {"development": True},
            "limits": {"budget": 10**12, "max_in_flight": 100_000},
            "identities": [{"agent": AGENT, "token": TOKEN}],
            "upstreams": [{"name": "demo", "url": "http://127.0.0.1:1/mcp"}],
        }
    )
    return Ceilings(config, store), Identity(agent=AGENT)


async def bench_memory(n: int) -> AdmitStats:
    from haltwire.store.counters.memory import MemoryCounters

    ceilings, identity = _ceilings(MemoryCounters())
    await _admit_loop(ceilings, identity, min(n, 2000))  # warm-up
    admit, both = await _admit_loop(ceilings, identity, n)
    return AdmitStats(admit, both)


async def bench_redis(url: str, n: int) -> AdmitStats | str:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    from haltwire.store.counters.redis import RedisCounters
    from haltwire.store.redis import redis_client

    wire = Counter[str]()

    class CountingConnection(aioredis.Connection):
        """Counts commands written to the socket: the round trips actually made."""

        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            wire["sent"] += 1
            await super().send_packed_command(command, check_health)

    prefix = f"hwbench-{uuid.uuid4().hex[:12]}"
    # The client RedisCounters builds for itself, with a connection class that counts.
    client = redis_client(url, timeout_s=0.5, connection_class=CountingConnection)
    store = RedisCounters(prefix=prefix, client=client)
    try:
        try:
            await store.ping()
        except Exception as exc:
            return f"skipped: Redis at {url} cannot be reached ({exc})"
        ceilings, identity = _ceilings(store)
        await _admit_loop(ceilings, identity, 200)  # warm-up: connection, script load
        rt0, w0 = store.round_trips, wire["sent"]
        from haltwire.store.counters import BudgetCounter, SlotCounter

        # Round trips for one admission alone, then for admit+release, on the wire.
        b = [BudgetCounter(f"{AGENT}:b", 0, 10**12, time.time() + 3600)]
        s = [SlotCounter(f"{AGENT}:f", 100_000)]
        k = 100
        for _ in range(k):
            await store.admit(b, s, "x", time.time())
        rt_admit = (store.round_trips - rt0) / k
        wire_admit = (wire["sent"] - w0) / k
        for _ in range(k):
            await store.release(s, "x")
        rt1, w1 = store.round_trips, wire["sent"]
        admit, both = await _admit_loop(ceilings, identity, n)
        stats = AdmitStats(admit, both, rt_admit=rt_admit, wire_admit=wire_admit)
        stats.rt_both = (store.round_trips - rt1) / n
        stats.wire_both = (wire["sent"] - w1) / n
        return stats
    finally:
        with contextlib.suppress(RedisError, OSError):
            cleaner = aioredis.Redis.from_url(url)
            keys = [k async for k in cleaner.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await cleaner.delete(*keys)
            await cleaner.aclose()
        await store.aclose()
        await client.aclose()  # a client given to the store is its owner's to close


async def bench_rule_cost(redis_url: str, n: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per store: the seconds of a call without rules and with the five (``tripwires.measure``:
    plan, admit, judge, release, settle)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    stores = ["memory", "redis"] if rule_cost.redis_answers(redis_url) else ["memory"]
    for kind in stores:
        none, _ = await rule_cost.cost(kind, rule_cost.RULES["none"], n, redis_url)
        five, _ = await rule_cost.cost(kind, rule_cost.RULES["gateway benchmark's five"], n, redis_url)
        out[kind] = (none, five)
    return out


# --------------------------------------------------------------------------------------
# (c): tools/call end to end
# --------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen[bytes] | None = None
    headers: dict[str, str] | None = None  #: instead of the benchmark's bearer token
    tool: str = TOOL  #: the name the server lists the benchmark's tool under

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid


async def bench_calls(
    opts: argparse.Namespace, workdir: Path
) -> tuple[dict[str, VariantStats], dict[str, Any]]:
    rounds, per_round, tput_n, conc, warm = (
        opts.rounds,
        opts.calls,
        opts.tput_calls,
        opts.concurrency,
        opts.warmup,
    )
    py = sys.executable
    me = SCRIPT
    info: dict[str, Any] = {}
    with processes() as procs:
        up_port = free_port()
        upstream_base = f"http://{HOST}:{up_port}"
        upstream_mcp = f"{upstream_base}/mcp"
        log = workdir / "upstream.log"
        procs.append(spawn([py, me, "serve", "upstream", "--port", str(up_port)], log))
        await wait_ready(f"{upstream_base}/state", procs[-1], log)

        servers: dict[str, Proc] = {"direct": Proc("direct", upstream_mcp, procs[0])}
        cfg = workdir / "haltwire.toml"
        cfg.write_text(gateway_config(upstream_mcp))
        cfg_tw = workdir / "haltwire-tripwires.toml"
        cfg_tw.write_text(gateway_config(upstream_mcp, tripwires=True))
        serve = [py, me, "serve"]
        gateway = [py, "-m", "haltwire", "gateway", "--port", "{port}", "--config"]
        commands: dict[str, list[str]] = {
            "haltwire": [*gateway, str(cfg)],
            TRIPWIRES: [*gateway, str(cfg_tw)],
            "floor": [*serve, "floor", "--upstream", upstream_mcp, "--port", "{port}"],
            "bare": [*serve, "bare", "--upstream", upstream_mcp, "--port", "{port}"],
            "bare+schema": [*serve, "bare", "--schema", "--upstream", upstream_mcp, "--port", "{port}"],
            "fastmcp": [*serve, "fastmcp", "--upstream", upstream_mcp, "--port", "{port}"],
        }
        for name, cmd in commands.items():
            if name not in opts.variants and not (name == "haltwire" and HANDSHAKE in opts.variants):
                continue
            port = free_port()
            log = workdir / f"{name.replace('+', '-')}.log"
            procs.append(spawn([c.replace("{port}", str(port)) for c in cmd], log))
            base = f"http://{HOST}:{port}"
            await wait_ready(f"{base}/mcp", procs[-1], log)
            servers[name] = Proc(name, f"{base}/mcp", procs[-1])
        if HANDSHAKE in opts.variants and "haltwire" in servers:
            servers[HANDSHAKE] = servers["haltwire"]
        if "contextforge" in opts.variants:
            why = contextforge.skipped_because(opts.contextforge_venv)
            if why is None:
                cf = await contextforge.start(opts.contextforge_venv, upstream_mcp, workdir / "contextforge")
                procs.append(cf.process)
                servers["contextforge"] = Proc(
                    "contextforge", cf.url, cf.process, cf.headers, cf.tools.get(TOOL, TOOL)
                )
            else:
                info.setdefault("skipped", {})["contextforge"] = why

        names = [v for v in VARIANTS if v in opts.variants and v in servers]
        stats = {v: VariantStats() for v in names}
        async with contextlib.AsyncExitStack() as stack, httpx2.AsyncClient(timeout=5.0) as http:
            lease = lease_token()
            clients = {
                v: await stack.enter_async_context(
                    mcp_client(
                        servers[v].url,
                        lease if v == TRIPWIRES else None,
                        mode="legacy" if v == HANDSHAKE else "auto",
                        headers=servers[v].headers,
                        tool=servers[v].tool,
                    )
                )
                for v in names
            }
            leans: dict[str, LeanClient] = {}
            for v in names:
                if v in LEAN_VARIANTS:
                    headers = dict(servers[v].headers or {"authorization": f"Bearer {TOKEN}"})
                    if v == TRIPWIRES:
                        headers["haltwire-lease"] = lease
                    lean = LeanClient(servers[v].url, headers, servers[v].tool, conc, _orders)
                    leans[v] = await stack.enter_async_context(lean)
            for v in names:  # warm-up: imports, connections, caches
                for _ in range(warm):
                    await one_call(clients[v])
                await throughput_block(clients[v], conc * 4, conc, VariantStats())
                if v in leans:
                    await leans[v].block(conc * 4, AMOUNT_CENTS)
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                if "haltwire" in order and TRIPWIRES in order:  # the pair, in turns in either order
                    i, j = order.index("haltwire"), order.index(TRIPWIRES)
                    if (i < j) != (r % 2 == 0):
                        order[i], order[j] = order[j], order[i]
                for v in order:
                    s = stats[v]
                    pid = servers[v].pid
                    posts0, served0 = await upstream_counts(http, upstream_base)
                    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
                    me0 = os.times()
                    await latency_block(clients[v], per_round, s)
                    me1 = os.times()
                    s.client_cpu_s += me1.user - me0.user + me1.system - me0.system
                    if pid is not None:
                        s.proxy_cpu_s += cpu_seconds(pid) - cpu0
                        s.proxy_cpu_calls += per_round
                    await throughput_block(clients[v], tput_n, conc, s)
                    lean_n = 0
                    if v in leans:
                        cpu0 = cpu_seconds(pid) if pid is not None else 0.0
                        calls_s, wrong = await leans[v].block(tput_n, AMOUNT_CENTS)
                        if pid is not None:
                            s.lean_cpu_s += cpu_seconds(pid) - cpu0
                        s.lean_throughput.append(calls_s)
                        s.errors += wrong
                        lean_n = tput_n
                        s.lean_calls += lean_n
                    posts1, served1 = await upstream_counts(http, upstream_base)
                    s.calls += per_round + tput_n + lean_n
                    s.upstream_posts += posts1 - posts0
                    s.upstream_served += served1 - served0
            info["upstream_requests"] = (await http.get(f"{upstream_base}/requests")).json()
    return stats, info


async def run(opts: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print(
        f"haltwire benchmark ({'quick' if opts.quick else 'full'} run), Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {load_average()} at the start; {machine_speed()}"
    )
    print()
    mem = await bench_memory(opts.admit_n)
    red = await bench_redis(opts.redis, opts.redis_n)
    checks = report_admission(mem, red, opts.redis)
    if TRIPWIRES in opts.variants:
        report_rule_cost(await bench_rule_cost(opts.redis, opts.rule_n), opts.redis)
    with tempfile.TemporaryDirectory(prefix="haltwire-bench-") as tmp:
        stats, info = await bench_calls(opts, Path(tmp))
    checks += report_calls(stats, opts, info)
    print()
    print("Targets:")
    for what, ok in checks:
        print(f"    [{'met' if ok else 'MISSED'}] {what}")
    print()
    print(f"(took {time.monotonic() - t0:.0f} s; load average {load_average()} at the end; {machine_speed()})")
    missed = [what for what, ok in checks if ok is False]
    print(f"{len(missed)} of {len(checks)} targets missed" if missed else f"every target met ({len(checks)})")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    serve = sub.add_parser("serve", help="(internal) run one server of the benchmark")
    serve.add_argument("role", choices=["upstream", "floor", "bare", "fastmcp"])
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--upstream", default="")
    serve.add_argument("--schema", action="store_true")
    serve.add_argument("--answer-bytes", type=int, default=0, help="(upstream) pad each answer's text")
    parser.add_argument("--quick", action="store_true", help="a short run (a few seconds per variant)")
    parser.add_argument("--redis", default=os.environ.get("HALTWIRE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--calls", type=int, default=None, help="sequential calls per round and variant")
    parser.add_argument("--tput-calls", type=int, default=None, help="throughput calls per round and variant")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}"
    )
    parser.add_argument(
        "--contextforge-venv",
        type=Path,
        default=contextforge.default_venv(REPO),
        help="ContextForge's own venv (default: $HALTWIRE_CONTEXTFORGE_VENV, else .venv-contextforge)",
    )
    opts = parser.parse_args(argv)
    if opts.cmd == "serve":
        runner: Callable[[], Awaitable[None]]
        backend: dict[str, Any] = {}
        if opts.role == "floor":
            runner = lambda: serve_floor(opts.upstream, HOST, opts.port)  # noqa: E731
            backend = fast_loop()
        elif opts.role == "upstream":
            runner = lambda: serve_upstream(opts.port, opts.answer_bytes)  # noqa: E731
        elif opts.role == "bare":
            runner = lambda: serve_bare(opts.upstream, opts.port, opts.schema)  # noqa: E731
        else:
            runner = lambda: serve_fastmcp(opts.upstream, opts.port)  # noqa: E731
        with contextlib.suppress(KeyboardInterrupt):
            anyio.run(runner, backend_options=backend)
        return 0
    opts.variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    unknown = set(opts.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")
    quick = opts.quick
    opts.rounds = opts.rounds or (2 if quick else 5)
    opts.calls = opts.calls or (50 if quick else 200)
    opts.tput_calls = opts.tput_calls or (80 if quick else 200)
    opts.warmup = 20 if quick else 50
    opts.admit_n = 5_000 if quick else 20_000
    opts.redis_n = 1_000 if quick else 5_000
    opts.rule_n = 1_000 if quick else 3_000
    return asyncio.run(run(opts))


if __name__ == "__main__":
    sys.exit(main())
