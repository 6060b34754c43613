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
sessionless and session-keeping clients; the gateway's CPU per call; against FastMCP and, when
installed, ContextForge), the five rules' cost, and what each call must cost the upstream. The
script exits 1 when a target it prints was missed.

The upstream is the demo upstream (``haltwire demo upstream``: ``DemoUpstream`` on uvicorn),
here under a thin ASGI wrapper that counts the HTTP requests it receives
(``GET /requests``); its own ``GET /state`` gives the tool calls it served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

import contextforge
import tripwires as rule_cost
from lean_client import LeanClient
from procs import HOST, free_port, load_average, pct, processes, spawn, wait_ready

TOKEN = "tok-bench"
AGENT = "bench-bot"
TOOL = "lookup_order"
#: Every call looks up another order (so the ``repeated_calls`` rule does not trip) and carries
#: an amount (so the money rule counts it); the demo upstream ignores ``amount_cents``.
AMOUNT_CENTS = 5
VARIANTS = [
    "direct",
    "haltwire",
    "haltwire+5tw",
    "haltwire-hs",
    "bare",
    "bare+schema",
    "fastmcp",
    "contextforge",
]
TRIPWIRES = "haltwire+5tw"
#: The variants the lean client measures too: every sessionless one (haltwire-hs is the same
#: gateway as haltwire; ContextForge is compared by latency).
LEAN_VARIANTS = frozenset({"direct", "haltwire", TRIPWIRES, "bare", "bare+schema", "fastmcp"})
#: A session-keeping client's calls take the fast path too: about the CPU of a sessionless one's.
MAX_HANDSHAKE_CPU_RATIO = 1.25
#: The same gateway as "haltwire", called by a session-keeping client (the initialize handshake,
#: protocol 2025-11-25), as the TypeScript SDK 1.x and the MCP Inspector always are.
HANDSHAKE = "haltwire-hs"
#: The target: the five rules cost at most this much of haltwire's p50 without them.
MAX_TRIPWIRE_RATIO = 1.10
#: Issue 18's targets: haltwire's p50 over direct's, for sessionless and session-keeping
#: clients; the gateway's CPU per call (ms) with the default config and with five rules; and
#: against the rivals, p50 at most this share of theirs and FastMCP's throughput this many times.
MAX_DIRECT_RATIO = 1.20
MAX_CPU_MS = 0.40
MAX_CPU_MS_TRIPWIRES = 0.50
MAX_FASTMCP_P50_SHARE = 0.5
MIN_FASTMCP_TPUT_RATIO = 2.0
MAX_CONTEXTFORGE_P50_SHARE = 0.1
LEASE_SECRET = "bench-lease-key-never-in-production-0123456789"
SCRIPT = str(Path(__file__).resolve())
REPO = Path(__file__).resolve().parent.parent
_orders = itertools.count(1)


# --------------------------------------------------------------------------------------
# Server roles: each runs in its own process (``gateway.py serve ROLE ...``).
# --------------------------------------------------------------------------------------


def _counting(app: Any, counts: Counter[str]) -> Any:
    """Wrap an ASGI app: count every HTTP request by method and Mcp-Method; serve GET /requests."""
    import json

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["path"] == "/requests":
                body = json.dumps(dict(counts)).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            method = ""
            for k, v in scope["headers"]:
                if k == b"mcp-method":
                    method = v.decode("latin-1")
            counts[scope["method"]] += 1
            counts[f"{scope['method']} {method}"] += 1
        await app(scope, receive, send)

    return wrapped


async def serve_upstream(port: int) -> None:
    from haltwire.demo.upstream import DemoUpstream
    from haltwire.serve import listen, serve_forever

    demo = DemoUpstream()
    await serve_forever(_counting(demo.http_app(), Counter()), listen(HOST, port))


async def serve_bare(upstream: str, port: int, with_schema: bool) -> None:
    """A pass-through on the SDK's low-level Server: no checks, one long-lived client upstream."""
    import mcp.types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server
    from mcp.server.transport_security import TransportSecuritySettings

    from haltwire.serve import listen, serve_forever

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=None))
    async with http, Client(streamable_http_client(upstream, http_client=http), cache=None) as client:
        tools = (await client.list_tools()).tools
        schemas = {t.name: dict(t.input_schema) for t in tools}

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await client.call_tool(params.name, params.arguments)

        server: Server[Any] = Server(
            "bare",
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
            get_tool_input_schema=schemas.get if with_schema else None,
        )
        app = server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        await serve_forever(app, listen(HOST, port))


async def serve_fastmcp(upstream: str, port: int) -> None:
    """FastMCP's create_proxy over an already-connected client, rate-limited per bearer token."""
    from fastmcp import Client as FastMCPClient
    from fastmcp.server import create_proxy
    from fastmcp.server.dependencies import get_http_request
    from fastmcp.server.middleware.rate_limiting import RateLimitingMiddleware

    from haltwire.serve import listen, serve_forever

    def caller(context: Any) -> str:
        return str(get_http_request().headers.get("authorization", "anonymous"))

    async with FastMCPClient(upstream) as backend:
        # A connected client: the proxy reuses its session for every request instead of
        # opening a fresh backend session per request (the fastest configuration).
        proxy = create_proxy(backend, name="fastmcp-proxy")
        proxy.add_middleware(
            RateLimitingMiddleware(max_requests_per_second=1e9, burst_capacity=10**9, get_client_id=caller)
        )
        app = proxy.http_app(stateless_http=True, json_response=True, host_origin_protection=False)
        await serve_forever(app, listen(HOST, port))


def gateway_config(upstream: str, tripwires: bool = False) -> str:
    extra = ""
    if tripwires:
        extra = f"""
[[leases.keys]]
kid = "bench"
secret = "{LEASE_SECRET}"
"""
        for rule in rule_cost.FIVE:
            extra += "\n[[tripwires]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in rule.items())
    return f"""
[gateway]
development = true

[counters]
backend = "memory"

[limits]
budget = 1000000000
window_s = 3600
max_in_flight = 100000

[[identities]]
agent = "{AGENT}"
token = "{TOKEN}"

[[upstreams]]
name = "demo"
url = "{upstream}"
{extra}"""


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def lease_token() -> str:
    """A lease for one run of the benchmark's identity, signed as the control plane signs them."""
    from haltwire.tokens import LeaseClaims, LeaseKeys

    keys = LeaseKeys({"bench": LEASE_SECRET.encode()}, signing="bench")
    now = time.time()
    return keys.sign(LeaseClaims(f"run-{uuid.uuid4().hex[:8]}", AGENT, "default", "0", 0, now, now + 86400))


# --------------------------------------------------------------------------------------
# Statistics and processes
# --------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


# --------------------------------------------------------------------------------------
# (a), (b): the admission decision
# --------------------------------------------------------------------------------------


@dataclass
class AdmitStats:
    admit_us: list[float]
    both_us: list[float]
    rt_admit: float = float("nan")
    rt_both: float = float("nan")
    wire_admit: float = float("nan")
    wire_both: float = float("nan")


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


# --------------------------------------------------------------------------------------
# (c): tools/call end to end
# --------------------------------------------------------------------------------------


@dataclass
class VariantStats:
    latencies_ms: list[float] = field(default_factory=list)
    rounds_p50: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)  # calls/s per round
    calls: int = 0
    upstream_posts: int = 0
    upstream_served: int = 0
    proxy_cpu_s: float = 0.0
    proxy_cpu_calls: int = 0
    client_cpu_s: float = 0.0
    errors: int = 0
    #: The lean client's throughput blocks (``lean_client``): calls/s per round, and the server's
    #: CPU over them (busy, its caches warm: the cost of a call under load).
    lean_throughput: list[float] = field(default_factory=list)
    lean_cpu_s: float = 0.0
    lean_calls: int = 0


class _Renamed:
    """A client whose calls of the benchmark's tool go to the name a proxy lists it under."""

    def __init__(self, client: Any, tool: str) -> None:
        self._client, self._tool = client, tool

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self._client.call_tool(self._tool if name == TOOL else name, arguments)


@contextlib.asynccontextmanager
async def mcp_client(
    url: str,
    lease: str | None = None,
    mode: str = "auto",
    headers: dict[str, str] | None = None,
    tool: str = TOOL,
) -> AsyncIterator[Any]:
    """The official MCP client over streamable HTTP, with a bearer token (or ``headers``; and
    ``lease`` in the ``Haltwire-Lease`` header on every request), no response cache; its calls
    of ``TOOL`` go to ``tool``, the name the server lists it under."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = dict(headers or {"Authorization": f"Bearer {TOKEN}"})
    if lease is not None:
        headers["Haltwire-Lease"] = lease
    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=60.0),
        limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64),
    )
    async with http, Client(streamable_http_client(url, http_client=http), cache=None, mode=mode) as client:
        # List once, as an agent does: the client validates structured results against the
        # listed output schema (it would otherwise list on the first call).
        listed = [t.name for t in (await client.list_tools()).tools]
        if tool not in listed:
            raise RuntimeError(f"{url} does not list {tool!r}: {listed}")
        yield client if tool == TOOL else _Renamed(client, tool)


async def one_call(client: Any) -> bool:
    order = str(next(_orders))
    result = await client.call_tool(TOOL, {"order_id": order, "amount_cents": AMOUNT_CENTS})
    return not result.is_error and result.structured_content == {"order_id": order, "status": "shipped"}


async def latency_block(client: Any, n: int, stats: VariantStats) -> None:
    clock = time.perf_counter
    lat: list[float] = []
    for _ in range(n):
        t0 = clock()
        ok = await one_call(client)
        lat.append((clock() - t0) * 1000)
        if not ok:
            stats.errors += 1
    stats.latencies_ms += lat
    stats.rounds_p50.append(statistics.median(lat))


async def throughput_block(client: Any, n: int, concurrency: int, stats: VariantStats) -> None:
    remaining = n

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            if not await one_call(client):
                stats.errors += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    stats.throughput.append(n / (time.perf_counter() - t0))


async def upstream_counts(http: httpx2.AsyncClient, base: str) -> tuple[int, int]:
    """(HTTP POSTs of any kind, tool calls served) at the upstream so far."""
    posts = (await http.get(f"{base}/requests")).json().get("POST", 0)
    served = (await http.get(f"{base}/state")).json()["total_served"]
    return int(posts), int(served)


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


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def report_admission(mem: AdmitStats, red: AdmitStats | str, redis_url: str) -> list[tuple[str, bool | None]]:
    print("(a) in-memory admission decision (Ceilings.admit + Ticket.release on MemoryCounters)")
    print(f"    iterations: {len(mem.both_us)}")
    print(
        f"    admit:           p50 {pct(mem.admit_us, 0.5):7.2f} µs   p99 {pct(mem.admit_us, 0.99):7.2f} µs"
    )
    print(f"    admit + release: p50 {pct(mem.both_us, 0.5):7.2f} µs   p99 {pct(mem.both_us, 0.99):7.2f} µs")
    print()
    print(f"(b) Redis admission decision (RedisCounters, {redis_url}, unique prefix, keys deleted after)")
    if isinstance(red, str):
        print(f"    {red}")
    else:
        print(f"    iterations: {len(red.both_us)}")
        print(
            f"    admit:           p50 {pct(red.admit_us, 0.5):7.1f} µs   p99 {pct(red.admit_us, 0.99):7.1f} µs"
        )
        print(
            f"    admit + release: p50 {pct(red.both_us, 0.5):7.1f} µs   p99 {pct(red.both_us, 0.99):7.1f} µs"
        )
        print(
            f"    round trips per admission: {red.rt_admit:.2f} (round_trips counter), "
            f"{red.wire_admit:.2f} (commands written to the socket)"
        )
        print(
            f"    round trips per admit+release: {red.rt_both:.2f} (round_trips counter), "
            f"{red.wire_both:.2f} (commands written to the socket)"
        )
    print()
    return [("in-memory admission p99 < 50 µs", pct(mem.both_us, 0.99) < 50.0)]


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


def report_rule_cost(costs: dict[str, tuple[list[float], list[float]]], redis_url: str) -> None:
    names = ", ".join(str(r["name"]) for r in rule_cost.FIVE)
    print(f"    the five tripwires' rules ({names}) per call, benchmarks/tripwires.py's measurement")
    print("    (plan + admit + judge + release + settle, against the same without rules):")
    for kind, (none, five) in costs.items():
        us = [1e6 * x for x in none], [1e6 * x for x in five]
        print(
            f"      {kind:<6} without p50 {pct(us[0], 0.5):7.1f} µs  p99 {pct(us[0], 0.99):7.1f} µs;  "
            f"with five p50 {pct(us[1], 0.5):7.1f} µs  p99 {pct(us[1], 0.99):7.1f} µs;  "
            f"the rules: p50 +{pct(us[1], 0.5) - pct(us[0], 0.5):.1f} µs"
        )
    if "redis" not in costs:
        print(f"      redis  skipped: Redis at {redis_url} does not answer")
    print()


def cpu_ms(s: VariantStats) -> float:
    """The CPU (ms, user+system) per call of the process the client talked to."""
    return 1000 * s.proxy_cpu_s / s.proxy_cpu_calls if s.proxy_cpu_calls else float("nan")


def issue18_checks(
    stats: dict[str, VariantStats], p50: dict[str, float], tput: dict[str, float]
) -> list[tuple[str, bool | None]]:
    """Issue 18's acceptance, for the variants this run measured."""
    checks: list[tuple[str, bool | None]] = []
    if "direct" in stats:
        for v, who in (("haltwire", "sessionless"), (HANDSHAKE, "session-keeping")):
            if v in stats:
                ratio = p50[v] / p50["direct"]
                checks.append(
                    (
                        f"{v} p50 <= {MAX_DIRECT_RATIO:.2f}x direct ({who}): {ratio:.2f}x",
                        ratio <= MAX_DIRECT_RATIO,
                    )
                )
    for v, most in (("haltwire", MAX_CPU_MS), (TRIPWIRES, MAX_CPU_MS_TRIPWIRES)):
        if v in stats:
            ms = cpu_ms(stats[v])
            checks.append((f"{v} gateway CPU per call <= {most:.2f} ms: {ms:.2f} ms", ms <= most))
    if "fastmcp" in stats:
        share, times = p50["haltwire"] / p50["fastmcp"], tput["haltwire"] / tput["fastmcp"]
        checks.append(
            (
                f"haltwire p50 <= {MAX_FASTMCP_P50_SHARE}x fastmcp's: {share:.2f}x",
                share <= MAX_FASTMCP_P50_SHARE,
            )
        )
        checks.append(
            (
                f"haltwire calls/s >= {MIN_FASTMCP_TPUT_RATIO:.0f}x fastmcp's: {times:.2f}x",
                times >= MIN_FASTMCP_TPUT_RATIO,
            )
        )
        h, f = stats["haltwire"].lean_throughput, stats["fastmcp"].lean_throughput
        if h and f:
            lean = statistics.median(h) / statistics.median(f)
            checks.append(
                (
                    f"haltwire calls/s >= {MIN_FASTMCP_TPUT_RATIO:.0f}x fastmcp's, lean client: {lean:.2f}x",
                    lean >= MIN_FASTMCP_TPUT_RATIO,
                )
            )
    if "contextforge" in stats:
        share = p50["haltwire"] / p50["contextforge"]
        checks.append(
            (
                f"haltwire p50 <= {MAX_CONTEXTFORGE_P50_SHARE}x contextforge's: {share:.3f}x",
                share <= MAX_CONTEXTFORGE_P50_SHARE,
            )
        )
    return checks


def report_calls(
    stats: dict[str, VariantStats], opts: argparse.Namespace, info: dict[str, Any]
) -> list[tuple[str, bool | None]]:
    print(
        f"(c) tools/call {TOOL} on loopback, official mcp.Client (streamable HTTP, httpx2, cache=None); "
        f"{opts.rounds} rounds, interleaved; per round and variant: {opts.calls} sequential calls "
        f"(latency), then {opts.tput_calls} calls by {opts.concurrency} concurrent tasks (throughput)"
    )
    p50 = {v: pct(s.latencies_ms, 0.5) for v, s in stats.items()}
    p99 = {v: pct(s.latencies_ms, 0.99) for v, s in stats.items()}
    tput = {v: statistics.median(s.throughput) for v, s in stats.items()}
    direct = "direct" if "direct" in stats else None
    header = (
        f"    {'variant':<12} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8} {'p50/direct':>10} "
        f"{'tput/direct':>11} {'server CPU':>10} {'client CPU':>10} {'lean calls/s':>12} {'loaded CPU':>10} "
        f"{'upstream req/call':>17} {'spread p50':>13}"
    )
    print(header)
    print("    " + "-" * (len(header) - 4))
    for v, s in stats.items():
        r_lat = f"{p50[v] / p50[direct]:.2f}x" if direct else "-"
        r_tp = f"{tput[v] / tput[direct]:.2f}x" if direct else "-"
        cpu = f"{1000 * s.proxy_cpu_s / s.proxy_cpu_calls:.2f}" if s.proxy_cpu_calls else "-"
        client_cpu = f"{1000 * s.client_cpu_s / s.proxy_cpu_calls:.2f}" if s.proxy_cpu_calls else "-"
        per_call = f"{s.upstream_posts / s.calls:.3f}" if s.calls else "-"
        spread = f"{min(s.rounds_p50):.2f}-{max(s.rounds_p50):.2f}"
        lean = f"{statistics.median(s.lean_throughput):.0f}" if s.lean_throughput else "-"
        loaded = f"{1000 * s.lean_cpu_s / s.lean_calls:.2f}" if s.lean_calls and s.lean_cpu_s else "-"
        print(
            f"    {v:<12} {p50[v]:>8.2f} {p99[v]:>8.2f} {tput[v]:>8.0f} {r_lat:>10} {r_tp:>11} "
            f"{cpu:>10} {client_cpu:>10} {lean:>12} {loaded:>10} {per_call:>17} {spread:>13}"
        )
    for v, why in info.get("skipped", {}).items():
        print(f"    {v:<14} skipped: {why}")
    print(
        "    calls/s: median over rounds. server CPU: user+system ms per call of the process the client "
        "talks to (the upstream for direct, else the proxy), client CPU: of this process, both over the "
        "latency blocks. spread: lowest and highest per-round p50.\n"
        f"    lean calls/s: the same {opts.tput_calls} calls per round by {opts.concurrency} tasks as raw JSON-RPC "
        "POSTs over kept-alive aiohttp connections (benchmarks/lean_client.py), median over rounds: the "
        "official client's calls/s stop where its own CPU does. loaded CPU: the server's CPU per call "
        "over those blocks (busy, caches warm)."
    )
    by_method = {
        k.removeprefix("POST "): v
        for k, v in info.get("upstream_requests", {}).items()
        if k.startswith("POST ")
    }
    print(f"    upstream HTTP POSTs over the whole run (start-ups included), by Mcp-Method: {by_method}")
    errors = {v: s.errors for v, s in stats.items() if s.errors}
    if errors:
        print(f"    ERRORS (unexpected results): {errors}")
    checks: list[tuple[str, bool | None]] = []
    if "haltwire" in stats:
        h = stats["haltwire"]
        print()
        print("    haltwire against the others:")
        for v in stats:
            if v == "haltwire":
                continue
            print(
                f"      vs {v:<12} p50 {p50['haltwire'] / p50[v]:.2f}x   p99 {p99['haltwire'] / p99[v]:.2f}x   "
                f"calls/s {tput['haltwire'] / tput[v]:.2f}x"
            )
        print()
        print(
            f"    upstream requests per tools/call through haltwire: {h.upstream_posts}/{h.calls} = "
            f"{h.upstream_posts / h.calls:.3f} HTTP POSTs (tool calls served: {h.upstream_served})"
        )
        checks.append(
            ("exactly one upstream request per tools/call", h.upstream_posts == h.calls == h.upstream_served)
        )
        for bare in ("bare", "bare+schema"):
            if bare in stats:
                checks.append((f"haltwire p50 <= {bare} p50", p50["haltwire"] <= p50[bare]))
        checks += issue18_checks(stats, p50, tput)
        if errors:
            checks.append(("every call answered correctly", False))
    if "haltwire" in stats and HANDSHAKE in stats:
        h, hs = stats["haltwire"], stats[HANDSHAKE]
        cpu_ratio = (hs.proxy_cpu_s / hs.proxy_cpu_calls) / (h.proxy_cpu_s / h.proxy_cpu_calls)
        print()
        print(
            f"    session-keeping client ({HANDSHAKE}) against sessionless (haltwire), same gateway: "
            f"p50 {p50[HANDSHAKE] / p50['haltwire']:.2f}x, gateway CPU per call {cpu_ratio:.2f}x; "
            f"target CPU <= {MAX_HANDSHAKE_CPU_RATIO:.2f}x (both on the fast path)"
        )
        checks.append(
            (
                f"session-keeping clients' gateway CPU per call <= {MAX_HANDSHAKE_CPU_RATIO:.2f}x sessionless",
                cpu_ratio <= MAX_HANDSHAKE_CPU_RATIO,
            )
        )
    if "haltwire" in stats and TRIPWIRES in stats:
        ratio = p50[TRIPWIRES] / p50["haltwire"]
        per_round = [
            t / h for t, h in zip(stats[TRIPWIRES].rounds_p50, stats["haltwire"].rounds_p50, strict=True)
        ]
        print()
        print(
            f"    haltwire + 5 tripwires ({TRIPWIRES}, with a lease) against haltwire without rules: "
            f"p50 {ratio:.3f}x ({p50[TRIPWIRES]:.2f} against {p50['haltwire']:.2f} ms; per round "
            f"{min(per_round):.2f}-{max(per_round):.2f}x), p99 {p99[TRIPWIRES] / p99['haltwire']:.2f}x, "
            f"calls/s {tput[TRIPWIRES] / tput['haltwire']:.2f}x; target p50 <= {MAX_TRIPWIRE_RATIO:.2f}x"
        )
        checks.append(
            (
                f"haltwire + 5 tripwires p50 <= {MAX_TRIPWIRE_RATIO:.2f}x haltwire p50",
                ratio <= MAX_TRIPWIRE_RATIO,
            )
        )
    return checks


async def run(opts: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print(
        f"haltwire benchmark ({'quick' if opts.quick else 'full'} run), Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {load_average()} at the start"
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
    print(f"(took {time.monotonic() - t0:.0f} s; load average {load_average()} at the end)")
    missed = [what for what, ok in checks if ok is False]
    print(f"{len(missed)} of {len(checks)} targets missed" if missed else f"every target met ({len(checks)})")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    serve = sub.add_parser("serve", help="(internal) run one server of the benchmark")
    serve.add_argument("role", choices=["upstream", "bare", "fastmcp"])
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--upstream", default="")
    serve.add_argument("--schema", action="store_true")
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
        if opts.role == "upstream":
            runner = lambda: serve_upstream(opts.port)  # noqa: E731
        elif opts.role == "bare":
            runner = lambda: serve_bare(opts.upstream, opts.port, opts.schema)  # noqa: E731
        else:
            runner = lambda: serve_fastmcp(opts.upstream, opts.port)  # noqa: E731
        with contextlib.suppress(KeyboardInterrupt):
            anyio.run(runner)
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
