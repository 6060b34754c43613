"""Whether open dashboards cost a stop anything: ``POST /v1/stops`` on the admin listener with no
dashboard open, and with ``--tabs`` signed-in dashboards following the live stream.

Run from the repository root::

    .venv/bin/python benchmarks/dashboard.py            # 10 tabs, 500 live runs, 3 rounds of 60 stops per case
    .venv/bin/python benchmarks/dashboard.py --quick    # 2 rounds of 20

One ``haltwire control`` (SQLite in a temporary directory, its two processes), ``--runs`` live
runs registered first (each open tab reads them again every 2 s and after every stop: the
dashboard's cost is in the admin process, the stop's). Each round times ``--stops`` stops with no
tab open, then opens the tabs, waits until each has had its first panels, and times as many
again; the stops name scopes no run has (``agent:bench-N``), and each is cleared after it is
timed, so the stops panel stays one row.

Exit status: 0 when the p50 with tabs open is within ``TARGET`` of the p50 without, 1 when it is
not, 2 when a server failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import anyio
import httpx2

from procs import HOST, free_port, load_average, pct, processes, run_benchmark, spawn, wait_ready

OPERATOR: Final = "tok-operator"
AGENT: Final = "tok-agent"
#: The p50 with tabs open may exceed the p50 without by at most this ratio.
TARGET: Final = 1.5
SECRET: Final = "k1-secret-" + "x" * 32


def control_toml(registry: Path, ports: dict[str, int]) -> str:
    return f"""[control]
development = true
port = {ports["agents"]}
admin_port = {ports["admin"]}
enforcement_port = {ports["enforcement"]}

[registry]
path = {json.dumps(str(registry))}

[leases]
signing_key = "k1"
[[leases.keys]]
kid = "k1"
secret = "{SECRET}"

[[identities]]
name = "oncall"
role = "operator"
token = "{OPERATOR}"

[[identities]]
name = "bench-runtime"
role = "agent"
agent = "bench-bot"
tenant = "acme"
token = "{AGENT}"
"""


async def tab(url: str, opened: anyio.Event, tg_done: anyio.Event) -> None:
    """One dashboard tab: signed in, following the live stream until ``tg_done``."""
    async with httpx2.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/dashboard/sign-in", data={"token": OPERATOR})
        if r.status_code != 303:
            raise RuntimeError(f"sign-in answered {r.status_code}")
        async with http.stream("GET", "/dashboard/events") as stream:
            with anyio.move_on_after(3600) as scope:
                async for line in stream.aiter_lines():
                    if line == "event: tick":
                        opened.set()
                    if tg_done.is_set():
                        scope.cancel()


async def stops(http: httpx2.AsyncClient, count: int, first: int) -> list[float]:
    """``count`` stops, each timed from the request's start to its 201, then cleared."""
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    took = []
    for n in range(first, first + count):
        started = time.perf_counter()
        r = await http.post("/v1/stops", json={"scope": f"agent:bench-{n}", "reason": "bench"}, headers=headers)
        took.append(time.perf_counter() - started)
        if r.status_code != 201:
            raise RuntimeError(f"a stop answered {r.status_code}: {r.text[:200]}")
        stop_id = r.json()["stop_id"]
        r = await http.post(f"/v1/stops/{stop_id}/clear", json={"reason": "bench"}, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"a clear answered {r.status_code}")
    return took


async def run(opts: argparse.Namespace) -> int:
    samples: dict[str, list[float]] = {"closed": [], "open": []}
    with tempfile.TemporaryDirectory(prefix="haltwire-dashboard-") as tmp, processes() as procs:
        ports = {name: free_port() for name in ("agents", "admin", "enforcement")}
        config = Path(tmp) / "control.toml"
        config.write_text(control_toml(Path(tmp) / "control.db", ports))
        log = Path(tmp) / "control.log"
        procs.append(spawn([sys.executable, "-m", "haltwire", "control", "--config", str(config)], log))
        admin, agents = f"http://{HOST}:{ports['admin']}", f"http://{HOST}:{ports['agents']}"
        await wait_ready(f"{admin}/healthz", procs[0], log)
        await wait_ready(f"{agents}/healthz", procs[0], log)
        async with httpx2.AsyncClient(base_url=agents, timeout=30) as http:
            for n in range(opts.runs):
                r = await http.post("/v1/runs", json={"run_id": f"run-{n}"}, headers={"Authorization": f"Bearer {AGENT}"})
                if r.status_code != 201:
                    raise RuntimeError(f"registering a run answered {r.status_code}: {r.text[:200]}")
        print(f"    {opts.runs} live runs registered; load average {load_average()}", flush=True)
        async with httpx2.AsyncClient(base_url=admin, timeout=30) as http:
            await stops(http, opts.warmup, 0)
            first = opts.warmup
            for n in range(opts.rounds):
                samples["closed"] += await stops(http, opts.stops, first)
                first += opts.stops
                done = anyio.Event()
                async with anyio.create_task_group() as tg:
                    opened = [anyio.Event() for _ in range(opts.tabs)]
                    for event in opened:
                        tg.start_soon(tab, admin, event, done)
                    with anyio.fail_after(60):
                        for event in opened:
                            await event.wait()
                    samples["open"] += await stops(http, opts.stops, first)
                    first += opts.stops
                    done.set()
                    tg.cancel_scope.cancel()
                print(f"    round {n + 1}/{opts.rounds} done", flush=True)
    return report(samples, opts)


def report(samples: dict[str, list[float]], opts: argparse.Namespace) -> int:
    print(f"\nPOST /v1/stops, ms ({opts.rounds} rounds; load average {load_average()}):")
    print(f"  {'case':<26} {'n':>5} {'p50':>8} {'p90':>8} {'p99':>8}")
    for case, label in (("closed", "no dashboard open"), ("open", f"{opts.tabs} dashboards open")):
        values = samples[case]
        print(
            f"  {label:<26} {len(values):>5} {pct(values, 0.5) * 1e3:>8.2f} "
            f"{pct(values, 0.9) * 1e3:>8.2f} {pct(values, 0.99) * 1e3:>8.2f}"
        )
    ratio = pct(samples["open"], 0.5) / pct(samples["closed"], 0.5)
    ok = ratio <= TARGET
    print(f"\np50 with dashboards open / without: {ratio:.2f} (target <= {TARGET}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 20 stops per case")
    parser.add_argument("--tabs", type=int, default=10)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--stops", type=int, default=60, help="stops per case per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    opts = parser.parse_args()
    if opts.quick:
        opts.stops, opts.rounds = 20, 2
    return run_benchmark(lambda: run(opts))


if __name__ == "__main__":
    sys.exit(main())
