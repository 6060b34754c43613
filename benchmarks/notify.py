"""Whether paging costs a stop anything: ``POST /v1/stops`` with no ``[[notify]]``, with a
receiver that hangs, with one that is down, and (for context) with one that answers.

Run from the repository root::

    .venv/bin/python benchmarks/notify.py            # 200 stops per case, about 40 s
    .venv/bin/python benchmarks/notify.py --quick    # 50 stops per case

Four control planes (``haltwire control``, SQLite in a temporary directory, each in its own
processes) run at once, one per case; each has one webhook receiver, ``timeout_s = 60``:

- ``none``: no ``[[notify]]``;
- ``hung``: a listener in this process that accepts the connection and never answers, so the
  first page's post hangs for the whole run and every later page waits behind it;
- ``down``: a port nothing listens on (connection refused: retried with backoff, audited);
- ``ok``: a listener that answers 200 to every page.

This process is the operator: it issues the stops (``agent:`` scopes, one new scope each) on
each plane's admin listener, one at a time, the cases interleaved in a shuffled order per stop
so that the machine's load falls on all of them alike, and times each answer (201) from the
request's start. It then checks that the receivers were in fact tried (the hung one holds a
connection, the down one's page is audited ``page.retry``, the ok one got pages).

Exit status: 0 when the hung case's p50 is within ``TARGET`` of the no-notify case's, 1 when it
is not, 2 when a server failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import httpx2

from procs import HOST, free_port, load_average, pct, processes, run_benchmark, spawn, wait_ready

OPERATOR_TOKEN: Final = "tok-operator"
#: The hung case's p50 may exceed the no-notify case's by at most this (a ratio of 1.10).
TARGET: Final = 0.10
CASES: Final = ("none", "hung", "down", "ok")


def control_toml(registry: Path, admin_port: int, url: str | None) -> str:
    lines = [
        "[control]",
        "development = true",
        f"admin_port = {admin_port}",
        "",
        "[registry]",
        f"path = {json.dumps(str(registry))}",
        "",
        "[[identities]]",
        'name = "operator-1"',
        'role = "operator"',
        f"token = {json.dumps(OPERATOR_TOKEN)}",
    ]
    if url is not None:
        lines += ["", "[[notify]]", 'name = "oncall"', 'kind = "webhook"', f"url = {json.dumps(url)}", "timeout_s = 60"]
    return "\n".join(lines) + "\n"


class Listeners:
    """The hung and the answering receivers, served by this process on raw TCP (no framework:
    what they cost this process's event loop must be nothing next to the timing)."""

    def __init__(self) -> None:
        self.held: list[anyio.abc.SocketStream] = []
        self.answered = 0

    async def hang(self, stream: anyio.abc.SocketStream) -> None:
        self.held.append(stream)  # never read, never answered, never closed until the end
        await anyio.sleep_forever()

    async def answer(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
                0,
            )
            while len(body) < length:
                body += await stream.receive()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            self.answered += 1


async def listen(tg: anyio.abc.TaskGroup, handler: Callable[[anyio.abc.SocketStream], Awaitable[None]]) -> int:
    """Serve ``handler`` on a loopback port (until ``tg`` is cancelled); the port."""
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    tg.start_soon(listener.serve, handler)
    return int(listener.extra(anyio.abc.SocketAttribute.local_port))


async def run(opts: argparse.Namespace) -> int:
    py = sys.executable
    rx = Listeners()
    samples: dict[str, list[float]] = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory(prefix="haltwire-notify-") as tmp, processes() as procs:
        workdir = Path(tmp)
        async with anyio.create_task_group() as tg:
            hung_port, ok_port = await listen(tg, rx.hang), await listen(tg, rx.answer)
            urls = {
                "none": None,
                "hung": f"http://{HOST}:{hung_port}/hook",
                "down": f"http://{HOST}:{free_port()}/hook",
                "ok": f"http://{HOST}:{ok_port}/hook",
            }
            admins = {}
            for case in CASES:
                port, admin_port = free_port(), free_port()
                config = workdir / f"{case}.toml"
                config.write_text(control_toml(workdir / f"{case}.db", admin_port, urls[case]))
                log = workdir / f"{case}.log"
                procs.append(spawn([py, "-m", "haltwire", "control", "--config", str(config), "--port", str(port)], log))
                admins[case] = f"http://{HOST}:{admin_port}"
                await wait_ready(f"{admins[case]}/healthz", procs[-1], log)
            headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
            clients = {c: httpx2.AsyncClient(base_url=admins[c], headers=headers, timeout=10.0) for c in CASES}
            try:
                for i in range(opts.warmup + opts.stops):
                    order = list(CASES)
                    random.shuffle(order)
                    for case in order:
                        body = {"scope": f"agent:bench-{uuid.uuid4().hex[:12]}", "reason": "benchmark"}
                        t0 = time.perf_counter()
                        r = await clients[case].post("/v1/stops", json=body)
                        ms = (time.perf_counter() - t0) * 1000
                        if r.status_code != 201:
                            raise RuntimeError(f"{case}: a stop was answered {r.status_code}: {r.text}")
                        if i >= opts.warmup:
                            samples[case].append(ms)
                    await anyio.sleep(random.uniform(0.005, 0.02))
                audit = (await clients["down"].get("/v1/audit")).json()["records"]
                retried = sum(1 for rec in audit if rec["action"] == "page.retry")
            finally:
                for client in clients.values():
                    await client.aclose()
            held = len(rx.held)
            tg.cancel_scope.cancel()
    return report(samples, held, retried, rx.answered, opts)


def report(samples: dict[str, list[float]], held: int, retried: int, answered: int, opts: argparse.Namespace) -> int:
    base50, base99 = pct(samples["none"], 0.5), pct(samples["none"], 0.99)
    print(f"POST /v1/stops, {opts.stops} stops per case, interleaved (load average {load_average()})")
    print(f"{'case':<6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p50 ratio':>10} {'p99 ratio':>10}")
    for case in CASES:
        v = samples[case]
        p50, p99 = pct(v, 0.5), pct(v, 0.99)
        print(
            f"{case:<6} {p50:8.2f} {pct(v, 0.95):8.2f} {p99:8.2f} {max(v):8.2f} "
            f"{p50 / base50:9.2f}x {p99 / base99:9.2f}x"
        )
    print(f"receivers tried: hung held {held} connection(s); down: {retried} page.retry record(s); ok answered {answered} page(s)")
    hung50 = pct(samples["hung"], 0.5)
    ok = hung50 <= base50 * (1 + TARGET)
    verdict = "met" if ok else "MISSED"
    print(f"target: hung p50 within {TARGET:.0%} of no-notify p50 ({hung50:.2f} vs {base50:.2f} ms): {verdict}")
    if held < 1 or retried < 1 or answered < 1:
        print("a receiver was never tried: the benchmark measured nothing", file=sys.stderr)
        return 2
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stops", type=int, default=200, help="stops per case (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="stops per case not counted (default 10)")
    parser.add_argument("--quick", action="store_true", help="50 stops per case")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.stops = 50

    async def go() -> int:
        return await run(opts)

    return run_benchmark(go)


if __name__ == "__main__":
    sys.exit(main())
