"""Whether paging costs a stop anything: ``POST /v1/stops`` with no ``[[notify]]``, with a
receiver that hangs, with one that is down, and (for context) with one that answers.

Run from the repository root::

    .venv/bin/python benchmarks/notify.py            # 300 stops per case in 3 rounds, about 1.5 minutes
    .venv/bin/python benchmarks/notify.py --quick    # 60 stops per case in 2 rounds

Five control planes (``haltwire control``, SQLite in a temporary directory, each in its own
processes) run at once, one per case, started afresh in each round; each has one webhook
receiver, ``timeout_s = 60``:

- ``none`` and ``none-b``: no ``[[notify]]``; two of them, pooled as the baseline, and compared
  with each other for the noise floor (on a busy machine, two identical planes differ by more
  than the cost paging could add);
- ``hung``: a listener in this process that accepts the connection and never answers, so the
  first page's post hangs for the whole run and every later page waits behind it;
- ``down``: a port nothing listens on (connection refused: retried with backoff, audited);
- ``ok``: a listener that answers 200 to every page.

This process is the operator: it issues the stops (``agent:`` scopes, one new scope each) on
each plane's admin listener, one at a time, the cases interleaved in a shuffled order per stop
so that the machine's load falls on all of them alike, and times each answer (201) from the
request's start. It then checks that the receivers were in fact tried (the hung one holds a
connection, the down one's page is audited ``page.retry``, the ok one got pages).

Exit status: 0 when the hung case's p50 is within ``TARGET`` of the no-paging planes' (pooled),
1 when it is not, 2 when a server failed or a receiver was never tried, 130 when interrupted.
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
#: The hung case's p50 may exceed the no-paging planes' by at most this (a ratio of 1.10).
TARGET: Final = 0.10
CASES: Final = ("none", "none-b", "hung", "down", "ok")


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
    rx = Listeners()
    samples: dict[str, list[float]] = {c: [] for c in CASES}
    retried = 0
    with tempfile.TemporaryDirectory(prefix="haltwire-notify-") as tmp:
        async with anyio.create_task_group() as tg:
            hung_port, ok_port = await listen(tg, rx.hang), await listen(tg, rx.answer)
            urls = {
                "none": None,
                "none-b": None,
                "hung": f"http://{HOST}:{hung_port}/hook",
                "down": f"http://{HOST}:{free_port()}/hook",
                "ok": f"http://{HOST}:{ok_port}/hook",
            }
            per_round = max(1, opts.stops // opts.rounds)
            for n in range(opts.rounds):
                print(f"    round {n + 1}/{opts.rounds}: {per_round} stops per case", flush=True)
                retried += await one_round(Path(tmp) / f"round-{n}", urls, per_round, opts.warmup, samples)
            held = len(rx.held)
            tg.cancel_scope.cancel()
    return report(samples, held, retried, rx.answered, opts)


async def one_round(
    workdir: Path, urls: dict[str, str | None], stops: int, warmup: int, samples: dict[str, list[float]]
) -> int:
    """Fresh control planes, one per case, and ``stops`` stops on each, interleaved; the number
    of ``page.retry`` records the down receiver's plane wrote."""
    await anyio.Path(workdir).mkdir()
    py = sys.executable
    with processes() as procs:
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
            for i in range(warmup + stops):
                order = list(CASES)
                random.shuffle(order)
                for case in order:
                    body = {"scope": f"agent:bench-{uuid.uuid4().hex[:12]}", "reason": "benchmark"}
                    t0 = time.perf_counter()
                    r = await clients[case].post("/v1/stops", json=body)
                    ms = (time.perf_counter() - t0) * 1000
                    if r.status_code != 201:
                        raise RuntimeError(f"{case}: a stop was answered {r.status_code}: {r.text}")
                    if i >= warmup:
                        samples[case].append(ms)
                await anyio.sleep(random.uniform(0.005, 0.02))
            audit = (await clients["down"].get("/v1/audit")).json()["records"]
            return sum(1 for rec in audit if rec["action"] == "page.retry")
        finally:
            for client in clients.values():
                await client.aclose()


def report(samples: dict[str, list[float]], held: int, retried: int, answered: int, opts: argparse.Namespace) -> int:
    # Two planes without paging: their pooled samples are the baseline, and their difference the
    # noise floor of this machine (an A/A comparison).
    base = samples["none"] + samples["none-b"]
    base50, base99 = pct(base, 0.5), pct(base, 0.99)
    print(
        f"POST /v1/stops, {len(samples['hung'])} stops per case in {opts.rounds} round(s), interleaved "
        f"(load average {load_average()})"
    )
    print(f"{'case':<7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p50 ratio':>10} {'p99 ratio':>10}")
    for case in CASES:
        v = samples[case]
        p50, p99 = pct(v, 0.5), pct(v, 0.99)
        print(
            f"{case:<7} {p50:8.2f} {pct(v, 0.95):8.2f} {p99:8.2f} {max(v):8.2f} "
            f"{p50 / base50:9.2f}x {p99 / base99:9.2f}x"
        )
    floor = pct(samples["none-b"], 0.5) / pct(samples["none"], 0.5)
    print(f"(ratios against both no-paging planes pooled; none-b against none, the noise floor: {floor:.2f}x)")
    print(
        f"receivers tried: hung held {held} connection(s); down: {retried} page.retry record(s); "
        f"ok answered {answered} page(s)"
    )
    hung50 = pct(samples["hung"], 0.5)
    ok = hung50 <= base50 * (1 + TARGET)
    verdict = "met" if ok else "MISSED"
    print(f"target: hung p50 within {TARGET:.0%} of no-paging p50 ({hung50:.2f} vs {base50:.2f} ms): {verdict}")
    if held < opts.rounds or retried < opts.rounds or answered < 1:
        print("a receiver was never tried: the benchmark measured nothing", file=sys.stderr)
        return 2
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--stops", type=int, default=300, help="stops per case, all rounds (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh control planes this many times (default 3)")
    parser.add_argument("--warmup", type=int, default=10, help="stops per case and round not counted (default 10)")
    parser.add_argument("--quick", action="store_true", help="60 stops per case in 2 rounds")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.stops, opts.rounds = 60, 2

    async def go() -> int:
        return await run(opts)

    return run_benchmark(go)


if __name__ == "__main__":
    sys.exit(main())
