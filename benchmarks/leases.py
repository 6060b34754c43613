"""Lease renewals per second through the control plane, and what a lease token costs to verify.

Run from the repository root::

    .venv/bin/python benchmarks/leases.py                      # SQLite and PostgreSQL, ~2 minutes
    .venv/bin/python benchmarks/leases.py --quick              # shorter phases
    .venv/bin/python benchmarks/leases.py --backend postgres

The control plane runs as its own process (``haltwire control``) with ``[leases]`` keys; this
process is the runtime(s). ``--runs`` live runs (default 10,000) are written straight into the
run store first (registration is measured separately, through the API). Then, per backend:

1. registration: ``POST /v1/runs``, one at a time (each is two durable writes: run + audit);
2. sustained batched renewal: every run renewed once per ``--every`` seconds (default 5) in
   ``POST /v1/leases/renew`` batches of ``--batch`` (default 200), sent open-loop at the
   target pace (10,000 / 5 s = 2,000 renewals/s = 10 batches/s); latency per batch;
3. saturation: batches sent back to back by 4 concurrent clients; renewals/s achieved;
4. single renewals: ``POST /v1/runs/{id}/lease`` by 8 concurrent clients; requests/s, latency.

Then ``LeaseKeys.verify``: a token's first verification (signature checked) and a cached one.
Target (issue 4): 2,000 renewals/s at p99 under 50 ms. Both processes share this machine's cores.
A batch's latency grows with its size (each grant is one HS256 signature, ~50 µs with PyJWT):
``--batch 50`` renews at the same rate in four times as many, shorter requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Final

import anyio
import httpx2

from haltwire.store.runs import QUERIES, RunRecord, as_row
from haltwire.tokens import LeaseClaims, LeaseKeys
from procs import HOST, free_port, load_average, pct, processes, spawn, wait_ready
from stop_propagation import postgres_schema

SECRET: Final = "bench-lease-key-" + "x" * 32
AGENT_TOKEN: Final = "bench-agent"
POSTGRES_URL: Final = os.environ.get("HALTWIRE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def control_toml(registry: dict[str, str]) -> str:
    lines = ["[control]", "development = true", "admin_port = 0", "enforcement_port = 0", "", "[registry]"]
    lines += [f'{k} = "{v}"' for k, v in registry.items()]
    lines += [
        "",
        "[leases]",
        'signing_key = "k1"',
        "",
        "[[leases.keys]]",
        'kid = "k1"',
        f'secret = "{SECRET}"',
    ]
    lines += ["", "[[identities]]", 'name = "runtime-1"', 'role = "agent"', f'token = "{AGENT_TOKEN}"']
    lines += ['agent = "bench"', 'tenant = "acme"', 'version = "1"']
    return "\n".join(lines) + "\n"


def seed_runs(registry: dict[str, str], n: int) -> list[str]:
    """``n`` live runs written in one transaction (the API path is measured separately)."""
    now = time.time()
    ids = [f"bench-{i:06d}" for i in range(n)]
    rows = [
        as_row(RunRecord(run_id, "bench", "acme", "1", (), "default", "runtime-1", now + i * 1e-6))
        for i, run_id in enumerate(ids)
    ]
    if registry["backend"] == "sqlite":
        import sqlite3

        lite = sqlite3.connect(registry["path"])
        with lite:
            lite.executemany(QUERIES["register"].format(runs="runs").replace(" RETURNING run_id", ""), rows)
        lite.close()
    else:
        import psycopg
        from psycopg import sql

        text = QUERIES["register"].replace(" RETURNING run_id", "").replace("?", "%s")
        query = sql.SQL(text).format(runs=sql.Identifier(registry["schema"], "runs"))
        with psycopg.connect(registry["url"]) as conn, conn.cursor() as cur:
            cur.executemany(query, rows)
    return ids


def summary(name: str, latencies: list[float], count: int, seconds: float, unit: str) -> str:
    ms = [x * 1000 for x in latencies]
    return (
        f"  {name:<34} {count / seconds:>9,.0f} {unit}/s   p50 {pct(ms, 0.5):6.1f} ms   "
        f"p99 {pct(ms, 0.99):6.1f} ms   max {max(ms):6.1f} ms   ({len(ms)} requests)"
    )


async def registrations(http: httpx2.AsyncClient, n: int) -> str:
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        r = await http.post("/v1/runs", json={})
        latencies.append(time.perf_counter() - t0)
        assert r.status_code == 201, r.text
    return summary("register (POST /v1/runs)", latencies, n, time.perf_counter() - start, "runs")


async def batch(http: httpx2.AsyncClient, runs: list[str], latencies: list[float]) -> int:
    t0 = time.perf_counter()
    r = await http.post("/v1/leases/renew", json={"runs": runs})
    latencies.append(time.perf_counter() - t0)
    body = r.json()
    if r.status_code != 200 or body["refused"]:
        raise RuntimeError(f"renewal failed: {r.status_code} {r.text[:300]}")
    return len(body["leases"])


async def sustained(http: httpx2.AsyncClient, ids: list[str], size: int, every: float, seconds: float) -> str:
    """Open loop: batches go out at the pace that renews every run once per ``every`` seconds."""
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    gap = every / len(batches)
    latencies: list[float] = []
    renewed = 0
    start = time.perf_counter()
    late = 0

    async def one(runs: list[str]) -> None:
        nonlocal renewed
        got = await batch(http, runs, latencies)
        renewed += got  # not "+= await": a concurrent add would be lost

    async with anyio.create_task_group() as tg:
        k = 0
        while (due := start + k * gap) < start + seconds:
            delay = due - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            elif delay < -gap:
                late += 1
            tg.start_soon(one, batches[k % len(batches)])
            k += 1
    elapsed = time.perf_counter() - start
    line = summary(f"sustained, batches of {size}", latencies, renewed, elapsed, "renewals")
    return line + ("" if not late else f"   [{late} sends more than one gap late]")


async def saturation(
    http: httpx2.AsyncClient, ids: list[str], size: int, seconds: float, workers: int
) -> str:
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    latencies: list[float] = []
    renewed = 0
    start = time.perf_counter()

    async def worker(w: int) -> None:
        nonlocal renewed
        k = w
        while time.perf_counter() - start < seconds:
            got = await batch(http, batches[k % len(batches)], latencies)
            renewed += got  # not "+= await": a concurrent add would be lost
            k += workers

    async with anyio.create_task_group() as tg:
        for w in range(workers):
            tg.start_soon(worker, w)
    elapsed = time.perf_counter() - start
    return summary(
        f"saturated, batches of {size}, {workers} clients", latencies, renewed, elapsed, "renewals"
    )


async def singles(http: httpx2.AsyncClient, ids: list[str], seconds: float, workers: int) -> str:
    latencies: list[float] = []
    start = time.perf_counter()

    async def worker(w: int) -> None:
        k = w
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            r = await http.post(f"/v1/runs/{ids[k % len(ids)]}/lease")
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"renewal failed: {r.status_code} {r.text[:300]}")
            k += workers

    async with anyio.create_task_group() as tg:
        for w in range(workers):
            tg.start_soon(worker, w)
    elapsed = time.perf_counter() - start
    return summary(
        f"single (POST /v1/runs/ID/lease), {workers} clients", latencies, len(latencies), elapsed, "renewals"
    )


async def backend(name: str, opts: argparse.Namespace, workdir: Path) -> list[str]:
    with contextlib.ExitStack() as stack:
        procs = stack.enter_context(processes())
        if name == "sqlite":
            registry = {"backend": "sqlite", "path": str(workdir / f"control-{uuid.uuid4().hex[:6]}.db")}
        else:
            schema = stack.enter_context(postgres_schema(POSTGRES_URL))
            registry = {"backend": "postgres", "url": POSTGRES_URL, "schema": schema}
        config = workdir / f"control-{name}.toml"
        config.write_text(control_toml(registry))
        port = free_port()
        url = f"http://{HOST}:{port}"
        log = workdir / f"control-{name}.log"
        args = [sys.executable, "-m", "haltwire", "control", "--config", str(config), "--port", str(port)]
        procs.append(spawn(args, log))
        await wait_ready(f"{url}/healthz", procs[-1], log)
        ids = seed_runs(registry, opts.runs)
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        limits = httpx2.Limits(max_connections=16)
        async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=30, limits=limits) as http:
            await batch(http, ids[: opts.batch], [])  # warm-up: the lease desk's first catch-up
            lines = [f"{name}: {opts.runs:,} live runs, control plane pid {procs[-1].pid}"]
            lines.append(await registrations(http, opts.registrations))
            lines.append(await sustained(http, ids, opts.batch, opts.every, opts.seconds))
            lines.append(await saturation(http, ids, opts.batch, opts.seconds / 2, 4))
            lines.append(await singles(http, ids, opts.seconds / 2, 8))
        return lines


def verify_cost(n: int) -> list[str]:
    keys = LeaseKeys({"k1": SECRET.encode()}, signing="k1")
    now = time.time()
    tokens = [keys.sign(LeaseClaims(f"run-{i}", "bench", "acme", "1", 7, now, now + 60)) for i in range(n)]
    fresh = LeaseKeys({"k1": SECRET.encode()})
    t0 = time.perf_counter()
    for token in tokens:
        fresh.verify(token, now=now)
    first = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(10):
        for token in tokens:
            fresh.verify(token, now=now)
    cached = (time.perf_counter() - t0) / (10 * n)
    t0 = time.perf_counter()
    for _ in range(n // 2):
        keys.sign(LeaseClaims("run-x", "bench", "acme", "1", 7, now, now + 60))
    sign = (time.perf_counter() - t0) / (n // 2)
    return [
        "LeaseKeys (HS256, PyJWT), in this process:",
        f"  verify, first time (signature checked)  {first * 1e6:8.1f} µs",
        f"  verify, cached token                     {cached * 1e6:8.1f} µs",
        f"  sign (one grant)                         {sign * 1e6:8.1f} µs",
    ]


async def run(opts: argparse.Namespace) -> int:
    print(f"cores {os.cpu_count()}, load average {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hwbench-leases-") as tmp:
        for name in opts.backend:
            for line in await backend(name, opts, Path(tmp)):
                print(line, flush=True)
    for line in verify_cost(20_000):
        print(line)
    print(
        f"target: {opts.runs:,} runs every {opts.every:g} s = {opts.runs / opts.every:,.0f} renewals/s, p99 < 50 ms"
    )
    print(f"load average after: {load_average()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 s phases instead of 20 s")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--every", type=float, default=5.0, help="renewal period of each run (s)")
    parser.add_argument("--registrations", type=int, default=200)
    opts = parser.parse_args(argv)
    opts.seconds = 5.0 if opts.quick else 20.0
    opts.backend = opts.backend or ["sqlite", "postgres"]
    return asyncio.run(run(opts))


if __name__ == "__main__":
    sys.exit(main())
