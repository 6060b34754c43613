"""How fast a stop reaches the gateway: from ``POST /v1/stops`` to a refused agent.

Run from the repository root::

    .venv/bin/python benchmarks/stop_propagation.py            # 200 stops, about a minute
    .venv/bin/python benchmarks/stop_propagation.py --quick    # 30 stops
    .venv/bin/python benchmarks/stop_propagation.py --backend postgres   # registry on PostgreSQL

The real stack runs as separate processes, started with the ``haltwire`` CLI:

- ``haltwire control``: the control plane, its registry on SQLite in a temporary directory
  (or on PostgreSQL in a schema unique to the run, dropped afterwards), heartbeat 1 s;
- ``haltwire demo upstream``: the demo MCP server;
- ``haltwire gateway``: the gateway, following the control plane (``[control]``,
  staleness 5 s). The control plane also re-reads its store once per heartbeat, so only the
  watch stream's push can explain a refusal well under 1 s.

This process is both the operator (on the control plane's admin listener) and the agents. ``--agents`` MCP sessions (the official
client, as ``ops-bot``) call ``lookup_order`` in a loop. For each stop, the operator issues
``agent:ops-bot`` with ``POST /v1/stops`` and takes t0 when the API response arrives; then

(a) t1: the first call refused ``stopped`` (with that stop's id) back at any agent;
(b) t1': the stop's event arriving on a separate ``/v1/watch`` stream (pure push latency);
(a') for context, t1 measured from the moment the request was sent (the API's own write included).

It then clears the stop and waits until a call that started after the clear is served, and
waits a random 10-50 ms (so stops do not fall in step with the agents' calls) before the
next one. A negative figure is a refusal or an event that arrived before the API answered
(the control plane wakes its watchers before it writes the audit record and answers).

Exit status: 0 when the run completed (the targets are printed, as in benchmarks/gateway.py),
2 when a stop was not seen within 10 s or a server failed, 130 when interrupted; the servers
are stopped in every case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2

from procs import HOST, free_port, load_average, pct, processes, run_benchmark, spawn, wait_ready

AGENT: Final = "ops-bot"
AGENT_TOKEN: Final = "tok-ops"  # the demo identity's development token
OPERATOR_TOKEN: Final = "tok-operator"
GATEWAY_TOKEN: Final = "tok-gateway"
TOOL: Final = "lookup_order"
ARGS: Final = {"order_id": "A-1"}
SCOPE: Final = f"agent:{AGENT}"
HEARTBEAT_S: Final = 1.0
STALENESS_S: Final = 5.0
TARGET_P99_MS: Final = 50.0
#: Published figures to compare with: a streaming feature-flag service's quoted update
#: latency, and revocation by a cache whose entries live 30 s.
FEATURE_FLAG_MS: Final = 200.0
CACHE_TTL_MS: Final = 30_000.0
#: One stop that takes this long to refuse an agent is a failure, not a slow sample.
STOP_TIMEOUT_S: Final = 10.0


# --------------------------------------------------------------------------------------
# Configs (TOML written by hand: JSON strings are valid TOML basic strings)
# --------------------------------------------------------------------------------------


def _s(value: str) -> str:
    return json.dumps(value)


def control_toml(
    registry: dict[str, str], admin_port: int, extra: str = "", enforcement_port: int | None = None
) -> str:
    lines = ["[control]", "development = true", f"admin_port = {admin_port}", f"heartbeat_s = {HEARTBEAT_S}"]
    if enforcement_port is not None:
        lines.append(f"enforcement_port = {enforcement_port}")
    lines += ["", "[registry]", *(f"{k} = {_s(v)}" for k, v in registry.items())]
    for name, role, token in (("operator-1", "operator", OPERATOR_TOKEN), ("gw-1", "gateway", GATEWAY_TOKEN)):
        lines += ["", "[[identities]]", f"name = {_s(name)}", f"role = {_s(role)}", f"token = {_s(token)}"]
    return "\n".join(lines) + "\n" + extra


def gateway_toml(upstream: str, control: str) -> str:
    from haltwire.demo.stack import UPSTREAM_KEY

    return f"""
[gateway]
development = true

[counters]
backend = "memory"

[limits]
budget = 1000000000
window_s = 3600
max_in_flight = 100000

[control]
url = {_s(control)}
token = {_s(GATEWAY_TOKEN)}
staleness_s = {STALENESS_S}

[[identities]]
agent = {_s(AGENT)}
token = {_s(AGENT_TOKEN)}

[[upstreams]]
name = "demo"
url = {_s(upstream + "/mcp")}
headers = {{ Authorization = {_s(UPSTREAM_KEY)} }}
"""


# --------------------------------------------------------------------------------------
# Statistics and processes (as in benchmarks/gateway.py)
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A schema name unique to this run; the schema is dropped afterwards."""
    import psycopg
    from psycopg import sql

    schema = f"hwbench_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        with (
            contextlib.suppress(psycopg.OperationalError),
            psycopg.connect(url, autocommit=True, connect_timeout=5) as conn,
        ):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# --------------------------------------------------------------------------------------
# The agents, the watcher and the operator
# --------------------------------------------------------------------------------------


@dataclass
class Observed:
    """What the agents and the watcher saw, keyed by stop id, as perf_counter seconds."""

    first_refusal: dict[str, float] = field(default_factory=dict)
    pushed: dict[str, float] = field(default_factory=dict)
    #: The latest start time of a call that was served.
    served_start: float = 0.0
    calls: int = 0
    calls_per_s: float = 0.0
    #: Round trip of every agent call, ms (the granularity at which an agent can see a stop).
    call_ms: list[float] = field(default_factory=list)
    unexpected: dict[str, int] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def touch(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()

    async def until(self, probe: Any, within: float, what: str) -> None:
        try:
            with anyio.fail_after(within):
                while not probe():
                    await self.changed.wait()
        except TimeoutError:
            raise RuntimeError(f"{what}: nothing after {within:g} s") from None


@contextlib.asynccontextmanager
async def mcp_client(url: str) -> AsyncIterator[Any]:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=httpx2.Timeout(30.0, read=60.0)
    )
    async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
        await client.list_tools()
        yield client


async def agent_loop(client: Any, seen: Observed) -> None:
    clock = time.perf_counter
    while True:
        start = clock()
        result = await client.call_tool(TOOL, ARGS)
        now = clock()
        seen.calls += 1
        seen.call_ms.append((now - start) * 1000)
        if not result.is_error:
            seen.served_start = max(seen.served_start, start)
            seen.touch()
            continue
        error = (result.structured_content or {}).get("error", {})
        code, stop_id = error.get("code"), error.get("stop_id")
        if code == "stopped" and stop_id:
            if stop_id not in seen.first_refusal:
                seen.first_refusal[stop_id] = now
                seen.touch()
        else:
            seen.unexpected[str(code)] = seen.unexpected.get(str(code), 0) + 1


async def watch_loop(control: str, seen: Observed, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """A separate /v1/watch stream: the time each stop's event arrives."""
    clock = time.perf_counter
    headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}"}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, read=STALENESS_S)) as http:
        revision = int((await http.get(f"{control}/healthz")).json()["revision"])
        async with http.stream("GET", f"{control}/v1/watch?since={revision}", headers=headers) as response:
            response.raise_for_status()
            task_status.started()
            event: dict[str, str] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    continue
                if line:
                    key, _, value = line.partition(":")
                    event[key] = value.removeprefix(" ")
                    continue
                if event.get("event") == "stop":
                    stop_id = json.loads(event["data"])["stop"]["stop_id"]
                    seen.pushed.setdefault(stop_id, clock())
                    seen.touch()
                event = {}
    raise RuntimeError("the watch stream ended")


@dataclass
class Sample:
    api_ms: float  # POST /v1/stops round trip
    issued_ms: float  # (a') request sent to the first refusal
    refused_ms: float  # (a) API response to the first refusal
    pushed_ms: float  # (b) API response to the watch event


async def one_stop(http: httpx2.AsyncClient, seen: Observed, n: int) -> Sample:
    clock = time.perf_counter
    sent = clock()
    r = await http.post("/v1/stops", json={"scope": SCOPE, "reason": f"bench stop {n}"})
    t0 = clock()
    if r.status_code != 201:
        raise RuntimeError(f"POST /v1/stops answered {r.status_code}: {r.text}")
    stop_id = r.json()["stop_id"]
    await seen.until(lambda: stop_id in seen.first_refusal, STOP_TIMEOUT_S, f"stop {stop_id}: refusal")
    await seen.until(lambda: stop_id in seen.pushed, STOP_TIMEOUT_S, f"stop {stop_id}: watch event")
    refused = seen.first_refusal[stop_id]
    sample = Sample(
        (t0 - sent) * 1000, (refused - sent) * 1000, (refused - t0) * 1000, (seen.pushed[stop_id] - t0) * 1000
    )
    r = await http.post(f"/v1/stops/{stop_id}/clear", json={"reason": "bench"})
    cleared = clock()
    if r.status_code != 200:
        raise RuntimeError(f"clearing {stop_id} answered {r.status_code}: {r.text}")
    # Served again: a call that started after the clear was answered, and served.
    await seen.until(lambda: seen.served_start >= cleared, STOP_TIMEOUT_S, f"stop {stop_id}: service back")
    await anyio.sleep(random.uniform(0.01, 0.05))
    return sample


def add_gateway_listener(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway-listener",
        choices=["enforcement", "agents"],
        default="enforcement",
        help="the control plane's listener the gateway follows (agents: as before the enforcement listener)",
    )


#: A load on the control plane's agents' listener while the stops are measured (``siege.py``):
#: called as ``load(control, task_status=...)``; the stops start once it reports itself started.
Load = Callable[..., Coroutine[Any, Any, None]]


async def bench(
    opts: argparse.Namespace,
    workdir: Path,
    registry: dict[str, str],
    load: Load | None = None,
    control_extra: str = "",
) -> tuple[list[Sample], Observed]:
    """The stops, issued through the admin listener, while ``load`` runs against the agents' one."""
    py = sys.executable
    seen = Observed()
    with processes() as procs:
        cp_port, admin_port, up_port, gw_port = free_port(), free_port(), free_port(), free_port()
        control = f"http://{HOST}:{cp_port}"
        admin = f"http://{HOST}:{admin_port}"
        upstream = f"http://{HOST}:{up_port}"
        gateway = f"http://{HOST}:{gw_port}/mcp"
        # The gateway (and the watch timed beside it) follows the enforcement listener, as the
        # docs say; "agents" puts it on the agents' listener (and runs on a control plane without one).
        enforcement_port = free_port() if opts.gateway_listener == "enforcement" else None
        followed = f"http://{HOST}:{enforcement_port}" if enforcement_port else control
        (workdir / "control.toml").write_text(
            control_toml(registry, admin_port, control_extra, enforcement_port)
        )
        (workdir / "gateway.toml").write_text(gateway_toml(upstream, followed))
        starts = [
            ("control", [py, "-m", "haltwire", "control", "--config", str(workdir / "control.toml")], cp_port,
             f"{followed}/healthz"),
            ("upstream", [py, "-m", "haltwire", "demo", "upstream"], up_port, f"{upstream}/mcp"),
            ("gateway", [py, "-m", "haltwire", "gateway", "--config", str(workdir / "gateway.toml")], gw_port,
             gateway),
        ]  # fmt: skip
        for name, cmd, port, ready in starts:
            log = workdir / f"{name}.log"
            procs.append(spawn([*cmd, "--port", str(port)], log))
            await wait_ready(ready, procs[-1], log)

        samples: list[Sample] = []
        headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        async with (
            contextlib.AsyncExitStack() as stack,
            httpx2.AsyncClient(base_url=admin, headers=headers, timeout=10.0) as http,
        ):
            # The sessions are opened before, and closed after, the task group that uses them.
            clients = [await stack.enter_async_context(mcp_client(gateway)) for _ in range(opts.agents)]
            async with anyio.create_task_group() as tg:
                await tg.start(watch_loop, followed, seen)
                for client in clients:
                    tg.start_soon(agent_loop, client, seen)
                if load is not None:
                    await tg.start(load, control)
                for i in range(opts.warmup):  # imports, connections, caches: not counted
                    await one_stop(http, seen, -i)
                t_start, calls0 = time.monotonic(), seen.calls
                for i in range(opts.stops):
                    samples.append(await one_stop(http, seen, i))
                    if (i + 1) % 50 == 0 and i + 1 < opts.stops:
                        done = [s.refused_ms for s in samples]
                        print(
                            f"    ... {i + 1}/{opts.stops} stops, so far p50 {pct(done, 0.5):.1f} ms "
                            f"p99 {pct(done, 0.99):.1f} ms to refusal",
                            flush=True,
                        )
                seen.calls_per_s = (seen.calls - calls0) / (time.monotonic() - t_start)
                tg.cancel_scope.cancel()
    return samples, seen


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def line(label: str, values: list[float]) -> str:
    return (
        f"    {label:<34} p50 {pct(values, 0.5):7.2f}  p95 {pct(values, 0.95):7.2f}  "
        f"p99 {pct(values, 0.99):7.2f}  max {max(values):7.2f}  ms"
    )


def report(samples: list[Sample], seen: Observed, opts: argparse.Namespace) -> bool:
    refused = [s.refused_ms for s in samples]
    pushed = [s.pushed_ms for s in samples]
    api = [s.api_ms for s in samples]
    print(f"stops measured: {len(samples)} (after {opts.warmup} warm-up stops, not counted)")
    print(line("(a) API response -> agent refused", refused))
    print(line("(b) API response -> watch event", pushed))
    print(line("(a') request sent -> agent refused", [s.issued_ms for s in samples]))
    print(line("    POST /v1/stops round trip", api))
    early_a = sum(1 for v in refused if v < 0)
    early_b = sum(1 for v in pushed if v < 0)
    print(
        f"    arrived before the API response: (a) {early_a}, (b) {early_b} of {len(samples)} "
        "(the control plane pushes before it writes the audit record and answers)"
    )
    print(
        f"    agent calls during the measured stops: {seen.calls_per_s:.0f}/s over {opts.agents} sessions, "
        f"round trip p50 {pct(seen.call_ms, 0.5):.1f} ms, p99 {pct(seen.call_ms, 0.99):.1f} ms"
    )
    if seen.unexpected:
        print(f"    UNEXPECTED refusals: {seen.unexpected}")
    p99 = pct(refused, 0.99)
    print()
    print(f"Compared with our p99 to refusal ({p99:.1f} ms):")
    print(
        f"    streaming feature-flag services, ~{FEATURE_FLAG_MS:.0f} ms quoted: {FEATURE_FLAG_MS / p99:.0f}x slower"
    )
    print(f"    revocation by a cache TTL of {CACHE_TTL_MS / 1000:.0f} s: {CACHE_TTL_MS / p99:.0f}x slower")
    print()
    ok = p99 < TARGET_P99_MS and not seen.unexpected
    print(
        f"{'PASS' if ok else 'FAIL'}: stop to refusal p99 {p99:.1f} ms "
        f"{'<' if p99 < TARGET_P99_MS else '>='} {TARGET_P99_MS:.0f} ms on loopback"
        + ("" if not seen.unexpected else " (and some calls were refused for another reason)")
    )
    push99 = pct(pushed, 0.99)
    print(
        f"{'PASS' if push99 < TARGET_P99_MS else 'FAIL'}: stop to watch event p99 {push99:.1f} ms "
        f"{'<' if push99 < TARGET_P99_MS else '>='} {TARGET_P99_MS:.0f} ms on loopback (the push alone; "
        "the refusal adds up to one agent call round trip)"
    )
    return ok and push99 < TARGET_P99_MS


async def run(opts: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print(
        f"haltwire stop propagation benchmark ({'quick' if opts.quick else 'full'} run), "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load_average()} at the start"
    )
    print(
        f"    haltwire control ({opts.backend} registry, heartbeat {HEARTBEAT_S:g} s), haltwire demo upstream, "
        f"haltwire gateway ([control] staleness {STALENESS_S:g} s): each its own process, on loopback"
    )
    print(
        f"    {opts.agents} MCP sessions as {AGENT} calling {TOOL} in a loop; {opts.stops} stops on {SCOPE}, "
        "each cleared (and service seen back) before the next"
    )
    print()
    with tempfile.TemporaryDirectory(prefix="haltwire-stops-") as tmp, contextlib.ExitStack() as stack:
        if opts.backend == "postgres":
            schema = stack.enter_context(postgres_schema(opts.postgres))
            registry = {"backend": "postgres", "url": opts.postgres, "schema": schema}
        else:
            registry = {"backend": "sqlite", "path": str(Path(tmp) / "control.db")}
        samples, seen = await bench(opts, Path(tmp), registry)
    met = report(samples, seen, opts)
    print()
    print(f"(took {time.monotonic() - t0:.0f} s; load average {load_average()} at the end)")
    return 0 if met else 1  # a missed target it printed fails the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (30 stops)")
    parser.add_argument("--stops", type=int, default=None, help="stops to measure (default 200)")
    parser.add_argument("--agents", type=int, default=4, help="concurrent agent sessions")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    add_gateway_listener(parser)
    parser.add_argument(
        "--postgres",
        default=os.environ.get("HALTWIRE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
        help="PostgreSQL URL for --backend postgres (a schema unique to the run, dropped afterwards)",
    )
    opts = parser.parse_args(argv)
    opts.stops = opts.stops or (30 if opts.quick else 200)
    opts.warmup = 3 if opts.quick else 5
    return run_benchmark(lambda: run(opts))


if __name__ == "__main__":
    sys.exit(main())
