"""What a run's report costs on a registry full of other runs: read by index, not by scan.

Run from the repository root::

    .venv/bin/python benchmarks/reports.py            # 50,000 other records, about 1 minute
    .venv/bin/python benchmarks/reports.py --quick    # 10,000

One control plane's stores (SQLite in a temporary directory, or ``--postgres``) in this process.
Run ``r-1`` is registered, proposes intents and is stopped and cleared through the API's rules
(``report`` is called as ``GET /v1/runs/{id}/report`` calls it). Its report is timed alone, then
again after ``--records`` audit records and one stop in fifty about other runs were written
beside it (each other run's record names it, as a run's records do). The rows the report read
(``counting_rows``) and the rows a full scan reads (what a report read before the index: every
stop and the whole audit log) are printed beside the times.

Exit status: 0 when the crowded report read as many rows as the lone one and its p50 is within
``TARGET`` of the lone one's; 1 when not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2

from haltwire.control import create_app, parse_control_config
from haltwire.control.access import authenticate
from haltwire.control.plane import Plane
from haltwire.control.reports import report
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving
from haltwire.store.sql import counting_rows

#: The crowded report's p50 against the lone one's.
TARGET: Final = 1.5
REPS: Final = 30
OPERATOR, GATEWAY, AGENT = "tok-operator", "tok-gateway", "tok-agent"


def config(registry: dict[str, Any]) -> dict[str, Any]:
    return {
        "control": {"development": True},
        "registry": registry,
        "leases": {"signing_key": "k", "keys": [{"kid": "k", "secret": "k" * 40}]},
        "identities": [
            {"name": "oncall", "role": "operator", "token": OPERATOR},
            {"name": "gateway-1", "role": "gateway", "token": GATEWAY},
            {"name": "bot", "role": "agent", "agent": "bot", "tenant": "acme", "version": "1", "token": AGENT},
        ],
    }


async def one_run(client: httpx2.AsyncClient) -> None:
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    assert (await client.post("/v1/runs", json={"run_id": "r-1"}, headers=auth(AGENT))).status_code == 201
    for n in range(5):
        body = {"run_id": "r-1", "agent": "bot", "tenant": "acme", "version": "1", "tool": "refund",
                "arguments": {"n": n}, "idempotency_key": f"k-{n}"}  # fmt: skip
        assert (await client.post("/v1/intents", json=body, headers=auth(GATEWAY))).status_code == 201
    r = await client.post("/v1/stops", json={"scope": "run:r-1", "reason": "loop"}, headers=auth(OPERATOR))
    stop_id = r.json()["stop_id"]
    r = await client.post(f"/v1/stops/{stop_id}/clear", json={"reason": "ok"}, headers=auth(OPERATOR))
    assert r.status_code == 200, r.text


async def crowd(stores: Stores, records: int) -> None:
    """``records`` audit records about other runs, one stop in fifty on another run, in batches."""
    now = time.time()
    for start in range(0, records, 500):
        async with stores.db.write():
            for n in range(start, min(records, start + 500)):
                run = f"other-{n // 10}"
                await stores.audit.append("bot", "agent", "run.renew", run, "ok", "", {"run_id": run}, now=now)
                if n % 50 == 0:
                    await stores.registry.issue_stop(f"run:{run}", "loop", "oncall", now=now)


async def timed(plane: Plane) -> tuple[float, int]:
    """The report's p50 in ms over ``REPS``, and the rows one report reads."""
    caller = authenticate(plane, f"Bearer {OPERATOR}")
    times = []
    for _ in range(REPS):
        with counting_rows() as counted:
            started = time.perf_counter()
            await report(plane, caller, "r-1")
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), counted.rows


async def scan(stores: Stores) -> tuple[float, int]:
    """What a report read before the index: every stop and the whole audit log."""
    with counting_rows() as counted:
        started = time.perf_counter()
        await stores.registry.all_stops()
        await stores.audit.records()
        return (time.perf_counter() - started) * 1000, counted.rows


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="haltwire-reports-") as tmp:
        registry: dict[str, Any] = {"backend": "sqlite", "path": str(Path(tmp) / "control.db")}
        if args.postgres:
            registry = {"backend": "postgres", "url": args.postgres, "schema": f"bench_reports_{int(time.time())}"}
        cfg = parse_control_config(config(registry))
        async with open_stores(cfg) as stores:
            app = create_app(cfg, stores, rules=False, pages=False)
            try:
                async with serving(app) as url, httpx2.AsyncClient(base_url=url, timeout=30) as client:
                    await one_run(client)
                    plane: Plane = app.state.plane
                    alone, rows_alone = await timed(plane)
                    scan_alone, scanned_alone = await scan(stores)
                    began = time.perf_counter()
                    await crowd(stores, args.records)
                    took = time.perf_counter() - began
                    print(f"wrote {args.records:,} other records in {took:.1f} s", file=sys.stderr)
                    crowded, rows_crowded = await timed(plane)
                    scan_crowded, scanned_crowded = await scan(stores)
            finally:
                if args.postgres:  # its schema goes however the run ends
                    with anyio.CancelScope(shield=True):
                        async with stores.db.write() as tx:
                            await tx.execute("DROP SCHEMA {schema} CASCADE")
    print(f"run report, {registry['backend']}: p50 of {REPS}, rows read by one report")
    print("| registry | report p50 ms | rows read | a full scan (before the index): ms | rows |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| run r-1 alone | {alone:.2f} | {rows_alone} | {scan_alone:.2f} | {scanned_alone} |")
    print(f"| + {args.records:,} other records | {crowded:.2f} | {rows_crowded} | {scan_crowded:.2f} | {scanned_crowded} |")
    ratio = crowded / alone
    ok = rows_crowded == rows_alone and ratio <= TARGET
    print(f"crowded p50 {ratio:.2f}x alone (target <= {TARGET}x), rows {rows_crowded} vs {rows_alone}: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 other records")
    parser.add_argument("--records", type=int, default=None, help="other runs' audit records (default 50,000)")
    parser.add_argument("--postgres", default=None, metavar="URL", help="PostgreSQL instead of SQLite (a schema of its own)")
    ns = parser.parse_args()
    ns.records = ns.records or (10_000 if ns.quick else 50_000)
    sys.exit(anyio.run(main, ns))
