"""The control plane's memory while many watchers replay a long history.

Run from the repository root::

    .venv/bin/python benchmarks/watch_memory.py                 # 100 watchers, 10,000 changes
    .venv/bin/python benchmarks/watch_memory.py --watchers 20 --changes 2000

A SQLite registry is filled with ``--changes`` stop/clear changes (stops with reasons of 2,000
characters, the most a reason may be, on as many runs), then ``haltwire control`` starts on it
as its own process. ``--watchers`` agent-role and viewer-role clients open ``GET /v1/watch``
from revision 0 at once and read each stream until its ``caught-up`` comment. The control
plane's resident set size (``VmRSS``) is read before, at its highest while they replay, and
after. Target (issue 11): growth under 50 MB; the script exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import anyio
import httpx2

from haltwire.sse import CAUGHT_UP, sse_events
from haltwire.store.registry.sqlite import SqliteRegistry
from procs import HOST, free_port, load_average, processes, run_benchmark, spawn, wait_ready

TARGET_MB: Final = 50.0
TOKENS: Final = {"agent": "bench-agent", "viewer": "bench-viewer"}


def control_toml(db: Path, port: int) -> str:
    return "\n".join(
        [
            "[control]",
            "development = true",
            f"port = {port}",
            "admin_port = 0",
            "enforcement_port = 0",
            "heartbeat_s = 5",
            "",
            "[registry]",
            'backend = "sqlite"',
            f'path = "{db}"',
            "",
            "[[identities]]",
            'name = "agent-1"',
            'role = "agent"',
            'agent = "a1"',
            f'token = "{TOKENS["agent"]}"',
            "",
            "[[identities]]",
            'name = "viewer-1"',
            'role = "viewer"',
            f'token = "{TOKENS["viewer"]}"',
            "",
        ]
    )


async def fill(db: Path, changes: int) -> None:
    registry = await SqliteRegistry.open(db)
    try:
        reason = "r" * 2000
        stops = changes // 2
        for i in range(stops):
            stop = await registry.issue_stop(f"run:r-{i}", reason, "op", now=time.time())
            await registry.clear_stop(stop.stop_id, "op", reason, now=time.time())
    finally:
        await registry.aclose()


def rss_mb(pid: int) -> float:
    """The resident set of ``pid`` and its descendants: ``haltwire control`` serves the agents'
    listener, where the watchers are, from a child process."""
    total = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total = int(line.split()[1]) / 1024
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):
            total += rss_mb(int(child))
    return total


async def replay(url: str, token: str) -> int:
    """Read one watch stream from revision 0 until caught up; the events it carried."""
    events = 0
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60.0)) as http:
        headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": "0"}
        async with http.stream("GET", f"{url}/v1/watch", headers=headers) as response:
            response.raise_for_status()
            async for event in sse_events(response.aiter_lines()):
                if event.comment == CAUGHT_UP:
                    return events
                if event.comment is None:
                    events += 1
    return events


async def main(opts: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp, processes() as procs:
        work = Path(tmp)
        db = work / "control.db"
        started = time.monotonic()
        await fill(db, opts.changes)
        print(f"registry: {opts.changes} changes written in {time.monotonic() - started:.1f} s", flush=True)
        port = free_port()
        (work / "control.toml").write_text(control_toml(db, port))
        log = work / "control.log"
        proc = spawn([sys.executable, "-m", "haltwire", "control", "--config", str(work / "control.toml")], log)
        procs.append(proc)
        url = f"http://{HOST}:{port}"
        await wait_ready(f"{url}/healthz", proc, log)
        before = rss_mb(proc.pid)
        peak = before
        done = anyio.Event()
        carried: list[int] = []

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_mb(proc.pid))
                await anyio.sleep(0.05)

        async def watcher(i: int) -> None:
            carried.append(await replay(url, TOKENS["agent" if i % 2 else "viewer"]))

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            async with anyio.create_task_group() as watchers:
                for i in range(opts.watchers):
                    watchers.start_soon(watcher, i)
            done.set()
        took = time.monotonic() - started
        await anyio.sleep(1.0)
        after = rss_mb(proc.pid)
        growth = max(peak, after) - before
        print(f"machine load: {load_average()}")
        print(
            f"{opts.watchers} watchers replayed {opts.changes} changes in {took:.1f} s "
            f"(viewers got {max(carried)} events each, agents {min(carried)})"
        )
        print(f"control plane RSS (both processes): {before:.0f} MB before, {peak:.0f} MB at the highest, {after:.0f} MB after")
        ok = growth < TARGET_MB
        print(f"growth {growth:.0f} MB (target < {TARGET_MB:.0f} MB): {'met' if ok else 'MISSED'}")
        return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--changes", type=int, default=10_000)
    opts = parser.parse_args()
    sys.exit(run_benchmark(lambda: main(opts)))
