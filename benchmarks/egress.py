"""The egress proxy (issue 15): how fast a stop closes an open tunnel, and what the proxy costs.

Run from the repository root::

    .venv/bin/python benchmarks/egress.py            # 300 request pairs, 12 transfer pairs, 60 stops
    .venv/bin/python benchmarks/egress.py --quick    # 60 request pairs, 4 transfer pairs, 20 stops

Separate processes, started with the ``haltwire`` CLI: the control plane (SQLite in a temporary
directory, heartbeat 1 s), a target on loopback (this file with ``--serve-target``: a one-line
HTTP answer to a ``GET``, N bytes to ``SEND N``, an echo otherwise) and ``haltwire egress``
following the control plane, the target allowed by address. This process is the agent (raw
sockets, a lease token minted with the proxy's key: one run per stop, so no stop fences the
next run) and the operator. It measures, interleaved (each pair in a random order, so drift
hits both alike):

(a) a small HTTP request, direct to the target and through the proxy (an absolute-URI
    request), each on a new connection (the proxy closes its connection after each request):
    connect to the last byte, p50 and p99, and the ratio of the medians;
(b) a transfer of ``--megabytes`` from the target, direct and through a ``CONNECT`` tunnel: the
    throughput, and the ratio;
(c) stop to tunnel closed: a tunnel of a run open (and idle) through the proxy; the operator
    stops ``run:RUN`` (t0: the ``POST /v1/stops`` answer) and t1 is the end of the client's
    stream (the proxy closed the tunnel).

Target (issue 15): (c) p99 under 50 ms. Exit 0 when it is met, 1 when it is missed, 2 when a
server failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import httpx2
import tomli_w

from haltwire.tokens import LeaseClaims, LeaseKeys
from procs import HOST, free_port, load_average, pct, processes, run_benchmark, spawn, wait_ready
from stop_propagation import GATEWAY_TOKEN, OPERATOR_TOKEN, STALENESS_S, control_toml

LEASE_SECRET: Final = "bench-egress-" + "k" * 32
KEYS: Final = LeaseKeys({"k1": LEASE_SECRET.encode()}, signing="k1")
TARGET_STOP_P99_MS: Final = 50.0
#: A generation past every stop of the run: the benchmark's runs are never fenced.
GENERATION: Final = 10**9


# -- the target (a process of its own) -------------------------------------------------------------


async def _target_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        first = await reader.readline()
        if first.startswith(b"GET "):
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        elif first.startswith(b"SEND "):
            left = int(first.split()[1])
            block = b"x" * 65_536
            while left > 0:
                writer.write(block[: min(left, len(block))])
                left -= len(block)
                await writer.drain()
        else:
            writer.write(first)
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        await writer.drain()
    except (ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def serve_target(port: int) -> None:
    async def run() -> None:
        server = await asyncio.start_server(_target_client, HOST, port)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


# -- the agent -------------------------------------------------------------------------------------


def token(run: str) -> str:
    now = time.time()
    return KEYS.sign(LeaseClaims(run, "bench-bot", "acme", "1.0", GENERATION, now, now + 3600))


def authorization(run: str) -> str:
    return "Basic " + base64.b64encode(f"{run}:{token(run)}".encode()).decode()


async def _read_all(stream: anyio.abc.SocketStream) -> int:
    n = 0
    try:
        while True:
            n += len(await stream.receive())
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return n


async def _tunnel(proxy: int, target: str, auth: str) -> anyio.abc.SocketStream:
    """A ``CONNECT`` tunnel through the proxy, its 200 read."""
    stream = await anyio.connect_tcp(HOST, proxy)
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
    await stream.send(head.encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += await stream.receive()
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the proxy refused the tunnel: {answer[:200]!r}")
    return stream


async def request(port: int, target: str, auth: str | None) -> float:
    """(a): one GET on a new connection, to the last byte, in ms."""
    t = time.perf_counter()
    stream = await anyio.connect_tcp(HOST, port)
    async with stream:
        if auth is None:
            await stream.send(f"GET /hello HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        else:
            head = f"GET http://{target}/hello HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}"
            await stream.send(f"{head}\r\n\r\n".encode())
        body = b""
        try:
            while True:
                body += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    if not (body.startswith(b"HTTP/1.1 200") and body.endswith(b"ok")):
        raise RuntimeError(f"the request was not served: {body[:200]!r}")
    return (time.perf_counter() - t) * 1000


async def transfer(port: int, target: str, auth: str | None, size: int) -> float:
    """(b): ``size`` bytes from the target, in MB/s."""
    t = time.perf_counter()
    stream = await anyio.connect_tcp(HOST, port) if auth is None else await _tunnel(port, target, auth)
    async with stream:
        await stream.send(f"SEND {size}\n".encode())
        got = await _read_all(stream)
    if got != size:
        raise RuntimeError(f"received {got} bytes of {size}")
    return size / 1e6 / (time.perf_counter() - t)


async def stop_to_close(proxy: int, target: str, ops: httpx2.AsyncClient, run: str) -> float:
    """(c): a tunnel of ``run`` open; the stop's 201 to the end of the client's stream, in ms."""
    stream = await _tunnel(proxy, target, authorization(run))
    async with stream:
        await stream.send(b"ping\n")
        assert await stream.receive() == b"ping\n"
        issued = await ops.post("/v1/stops", json={"scope": f"run:{run}", "reason": "bench"})
        t0 = time.perf_counter()
        if issued.status_code != 201:
            raise RuntimeError(f"the stop was not issued: {issued.text}")
        with anyio.fail_after(10):
            await _read_all(stream)
        t1 = time.perf_counter()
    await anyio.sleep(random.uniform(0.01, 0.05))
    return (t1 - t0) * 1000


async def paired(
    n: int, warmup: int, measure: dict[str, Callable[[], Awaitable[float]]]
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in measure}
    for i in range(warmup + n):
        order = list(measure)
        random.shuffle(order)
        for which in order:
            value = await measure[which]()
            if i >= warmup:
                out[which].append(value)
    return out


def line(name: str, values: list[float], unit: str) -> str:
    p50, p99 = pct(values, 0.5), pct(values, 0.99)
    return f"  {name:<7} p50 {p50:8.3f} {unit}   p99 {p99:8.3f} {unit}   (n={len(values)})"


async def main(opts: argparse.Namespace) -> int:
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="haltwire-bench-egress-") as tmp, processes() as procs:
        workdir = Path(tmp)
        cp_port, admin_port, target_port, proxy_port = (free_port() for _ in range(4))
        control, admin = f"http://{HOST}:{cp_port}", f"http://{HOST}:{admin_port}"
        target = f"{HOST}:{target_port}"
        registry = {"backend": "sqlite", "path": str(workdir / "control.db")}
        (workdir / "control.toml").write_text(control_toml(registry, admin_port))
        egress = {
            "egress": {"development": True, "profiles": {"bench": [target]}, "agents": {"bench-bot": "bench"}},
            "control": {"url": control, "token": GATEWAY_TOKEN, "staleness_s": STALENESS_S},
            "leases": {"keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        }
        (workdir / "egress.toml").write_text(tomli_w.dumps(egress))
        starts = [
            ("control", [py, "-m", "haltwire", "control", "--config", str(workdir / "control.toml")], cp_port, f"{control}/healthz"),
            ("target", [py, __file__, "--serve-target"], target_port, f"http://{target}/ready"),
            ("egress", [py, "-m", "haltwire", "egress", "--config", str(workdir / "egress.toml")], proxy_port, f"http://{HOST}:{proxy_port}/"),
        ]  # fmt: skip
        for name, cmd, port, ready in starts:
            log = workdir / f"{name}.log"
            procs.append(spawn([*cmd, "--port", str(port)], log))
            await wait_ready(ready, procs[-1], log)
        auth = authorization("bench-requests")
        size = int(opts.megabytes * 1e6)
        print(f"load average before: {load_average()}")
        latency = await paired(
            opts.pairs,
            opts.warmup,
            {
                "direct": lambda: request(target_port, target, None),
                "proxy": lambda: request(proxy_port, target, auth),
            },
        )
        print("(a) a small HTTP request on a new connection (connect to last byte):")
        print(line("direct", latency["direct"], "ms"))
        print(line("proxy", latency["proxy"], "ms"))
        added = pct(latency["proxy"], 0.5) - pct(latency["direct"], 0.5)
        ratio = pct(latency["proxy"], 0.5) / pct(latency["direct"], 0.5)
        print(f"  added   p50 {added:8.3f} ms   ratio of p50 {ratio:.2f}")
        speed = await paired(
            opts.transfers,
            1,
            {
                "direct": lambda: transfer(target_port, target, None, size),
                "proxy": lambda: transfer(proxy_port, target, auth, size),
            },
        )
        print(f"(b) {opts.megabytes:g} MB from the target (direct, and through a CONNECT tunnel):")
        print(line("direct", speed["direct"], "MB/s"))
        print(line("tunnel", speed["proxy"], "MB/s"))
        print(f"  ratio of p50 (tunnel / direct) {pct(speed['proxy'], 0.5) / pct(speed['direct'], 0.5):.2f}")
        headers = {"authorization": f"Bearer {OPERATOR_TOKEN}"}
        async with httpx2.AsyncClient(base_url=admin, headers=headers, timeout=10) as ops:
            stops = [await stop_to_close(proxy_port, target, ops, f"bench-stop-{i}") for i in range(opts.stops)]
        print("(c) stop to tunnel closed (from the stop's 201 to the end of the client's stream):")
        print(line("", stops, "ms"))
        print(f"load average after: {load_average()}")
        met = pct(stops, 0.99) < TARGET_STOP_P99_MS
        print(
            f"target: stop to tunnel closed p99 {pct(stops, 0.99):.1f} ms "
            f"(target < {TARGET_STOP_P99_MS:g} ms): {'met' if met else 'NOT met'}"
        )
    return 0 if met else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="60 request pairs, 4 transfer pairs, 20 stops")
    parser.add_argument("--megabytes", type=float, default=None, help="the size of a transfer (b)")
    parser.add_argument("--serve-target", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve_target:
        serve_target(options.port)
        sys.exit(0)
    options.pairs, options.transfers, options.stops, options.warmup = (
        (60, 4, 20, 10) if options.quick else (300, 12, 60, 30)
    )
    if options.megabytes is None:
        options.megabytes = 50.0 if options.quick else 200.0
    sys.exit(run_benchmark(lambda: main(options)))
