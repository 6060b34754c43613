"""Model calls through the gateway (issue 14): the added latency, and how fast a stop ends a stream.

Run from the repository root::

    .venv/bin/python benchmarks/models.py            # 400 pairs of each kind, 50 stops
    .venv/bin/python benchmarks/models.py --quick    # 60 pairs, 15 stops

Separate processes, started with the ``haltwire`` CLI: the control plane (SQLite in a temporary
directory, heartbeat 1 s), the demo upstream (a gateway needs one), a scripted OpenAI-compatible
provider (this file with ``--serve-provider``: a chat completion at once, whole or as 20 stream
events) and the gateway (``[[models]]`` routing every model to it, following the control plane).
This process is the agent (httpx2, one connection each to the gateway and to the provider) and
the operator. It measures, interleaved (each pair in a random order, so drift hits both alike):

(a) a whole ``POST /v1/chat/completions``, direct to the provider and through the gateway: the
    gateway's added latency (p50, p99) and the ratio of the medians;
(b) a streamed one: the time to the first byte of the stream, both ways;
(c) stop to stream end: a stream through the gateway that the provider keeps open; the operator
    stops ``agent:ops-bot`` (t0: the ``POST /v1/stops`` answer) and t1 is the end of the
    client's stream (its last event names the stop). Then the stop is cleared and the next
    stream waits until a call is served again.

Targets (issue 14): (a) p50 overhead under 1 ms, (c) p99 under 50 ms. Exit 0 when both are
met, 1 when one is missed, 2 when a server failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2

from procs import HOST, free_port, load_average, pct, processes, run_benchmark, spawn, wait_ready
from stop_propagation import AGENT_TOKEN, GATEWAY_TOKEN, OPERATOR_TOKEN, STALENESS_S, control_toml

KEY_ENV: Final = "HALTWIRE_BENCH_MODEL_KEY"
PROVIDER_KEY: Final = "sk-bench-provider"
BODY: Final = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
TARGET_OVERHEAD_MS: Final = 1.0
TARGET_STOP_P99_MS: Final = 50.0


# -- the scripted provider (a process of its own) ----------------------------------------------


def _answer() -> bytes:
    message = {"role": "assistant", "content": "Hello there."}
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_800_000_000,
            "model": "bench",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        }
    ).encode()


def _events() -> list[bytes]:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_800_000_000, "model": "bench"}
    out = [
        f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {'content': f'w{i} '}}]})}\n\n".encode()
        for i in range(20)
    ]
    usage = {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}
    out.append(f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n".encode())
    return [*out, b"data: [DONE]\n\n"]


ANSWER, EVENTS = _answer(), _events()


async def provider(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] != "POST":  # the readiness probe
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    if not request.get("stream"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": ANSWER})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    if request.get("model") == "hang":  # one event, then open until the client goes
        await send({"type": "http.response.body", "body": EVENTS[0], "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await send({"type": "http.response.body", "body": b"".join(EVENTS)})


def serve_provider(port: int) -> None:
    import uvicorn

    uvicorn.run(provider, host=HOST, port=port, log_level="warning", lifespan="off")


# -- the measurements ------------------------------------------------------------------------------


def gateway_toml(upstream: str, control: str, provider_url: str) -> str:
    s = json.dumps
    return f"""
[gateway]
development = true

[limits]
deadline_s = 120

[control]
url = {s(control)}
token = {s(GATEWAY_TOKEN)}
staleness_s = {STALENESS_S}

[[identities]]
agent = "ops-bot"
token = {s(AGENT_TOKEN)}

[[upstreams]]
name = "demo"
url = {s(upstream + "/mcp")}

[[models]]
name = "bench"
base_url = {s(provider_url + "/v1")}
api_key_env = {s(KEY_ENV)}
models = ["bench", "hang"]
"""


async def whole(http: httpx2.AsyncClient, url: str) -> float:
    t = time.perf_counter()
    r = await http.post(url, json=BODY)
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t) * 1000


async def first_byte(http: httpx2.AsyncClient, url: str) -> float:
    t = time.perf_counter()
    async with http.stream("POST", url, json={**BODY, "stream": True}) as r:
        assert r.status_code == 200
        chunks = r.aiter_raw()
        await anext(chunks)
        ttfb = (time.perf_counter() - t) * 1000
        async for _ in chunks:  # the rest, so the connection is reused
            pass
    return ttfb


async def paired(n: int, warmup: int, measure: Any, urls: dict[str, str], http: dict[str, Any]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"direct": [], "gateway": []}
    for i in range(warmup + n):
        order = list(urls)
        random.shuffle(order)
        for which in order:
            ms = await measure(http[which], urls[which])
            if i >= warmup:
                out[which].append(ms)
    return out


async def stop_to_end(gw: httpx2.AsyncClient, admin: httpx2.AsyncClient, url: str) -> float:
    async with gw.stream("POST", url, json={**BODY, "model": "hang", "stream": True}) as r:
        assert r.status_code == 200
        chunks = r.aiter_raw()
        await anext(chunks)  # the provider is "generating"
        issued = await admin.post("/v1/stops", json={"scope": "agent:ops-bot", "reason": "bench"})
        t0 = time.perf_counter()
        assert issued.status_code == 201, issued.text
        rest = b"".join([c async for c in chunks])
        t1 = time.perf_counter()
    stop_id = issued.json()["stop_id"]
    assert stop_id.encode() in rest, rest[-300:]
    cleared = await admin.post(f"/v1/stops/{stop_id}/clear", json={"reason": "bench"})
    assert cleared.status_code == 200, cleared.text
    with anyio.fail_after(10):
        while (await gw.post(url, json=BODY)).status_code != 200:
            await anyio.sleep(0.01)
    await anyio.sleep(random.uniform(0.01, 0.05))
    return (t1 - t0) * 1000


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, in ms (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def line(name: str, values: list[float]) -> str:
    return f"  {name:<9} p50 {pct(values, 0.5):7.3f} ms   p99 {pct(values, 0.99):7.3f} ms   (n={len(values)})"


def report(kind: str, samples: dict[str, list[float]]) -> float:
    d, g = samples["direct"], samples["gateway"]
    added = pct(g, 0.5) - pct(d, 0.5)
    print(f"{kind}:")
    print(line("direct", d))
    print(line("gateway", g))
    print(f"  added    p50 {added:7.3f} ms   p99 {pct(g, 0.99) - pct(d, 0.99):7.3f} ms   ratio of p50 {pct(g, 0.5) / pct(d, 0.5):.2f}")
    return added


async def main(opts: argparse.Namespace) -> int:
    py = sys.executable
    os.environ[KEY_ENV] = PROVIDER_KEY
    with tempfile.TemporaryDirectory(prefix="haltwire-bench-models-") as tmp, processes() as procs:
        workdir = Path(tmp)
        cp_port, admin_port, up_port, gw_port, pv_port = (free_port() for _ in range(5))
        control, admin = f"http://{HOST}:{cp_port}", f"http://{HOST}:{admin_port}"
        upstream, provider_url = f"http://{HOST}:{up_port}", f"http://{HOST}:{pv_port}"
        gateway = f"http://{HOST}:{gw_port}"
        registry = {"backend": "sqlite", "path": str(workdir / "control.db")}
        (workdir / "control.toml").write_text(control_toml(registry, admin_port))
        (workdir / "gateway.toml").write_text(gateway_toml(upstream, control, provider_url))
        starts = [
            ("control", [py, "-m", "haltwire", "control", "--config", str(workdir / "control.toml")], cp_port, f"{control}/healthz"),
            ("upstream", [py, "-m", "haltwire", "demo", "upstream"], up_port, f"{upstream}/mcp"),
            ("provider", [py, __file__, "--serve-provider"], pv_port, f"{provider_url}/v1/models"),
            ("gateway", [py, "-m", "haltwire", "gateway", "--config", str(workdir / "gateway.toml")], gw_port, f"{gateway}/healthz"),
        ]  # fmt: skip
        for name, cmd, port, ready in starts:
            log = workdir / f"{name}.log"
            procs.append(spawn([*cmd, "--port", str(port)], log))
            await wait_ready(ready, procs[-1], log)
        urls = {"direct": f"{provider_url}/v1/chat/completions", "gateway": f"{gateway}/v1/chat/completions"}
        limits = httpx2.Limits(max_connections=1)
        async with (
            httpx2.AsyncClient(headers={"authorization": f"Bearer {PROVIDER_KEY}"}, limits=limits, timeout=30) as direct,
            httpx2.AsyncClient(headers={"authorization": f"Bearer {AGENT_TOKEN}"}, limits=limits, timeout=30) as gw,
            httpx2.AsyncClient(base_url=admin, headers={"authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=10) as ops,
        ):
            with anyio.fail_after(30):  # the gateway is ready once it has its stops
                while (await gw.get(f"{gateway}/readyz")).status_code != 200:
                    await anyio.sleep(0.05)
            http = {"direct": direct, "gateway": gw}
            print(f"load average before: {load_average()}")
            gateway_pid, before = procs[-1].pid, cpu_ms(procs[-1].pid)
            added = report("(a) whole chat completion", await paired(opts.pairs, opts.warmup, whole, urls, http))
            per_call = (cpu_ms(gateway_pid) - before) / (opts.pairs + opts.warmup)
            print(f"  the gateway's CPU per call: {per_call:.2f} ms")
            report("(b) stream, time to first byte", await paired(opts.pairs, opts.warmup, first_byte, urls, http))
            stops = [await stop_to_end(gw, ops, urls["gateway"]) for _ in range(opts.stops)]
        print("(c) stop to stream end (from the stop's 201):")
        print(line("", stops))
        print(f"load average after: {load_average()}")
        overhead_met, stop_met = added < TARGET_OVERHEAD_MS, pct(stops, 0.99) < TARGET_STOP_P99_MS
        print(
            f"targets: p50 added {added:.3f} ms (target < {TARGET_OVERHEAD_MS:g} ms): "
            f"{'met' if overhead_met else 'NOT met'}; stop to stream end p99 "
            f"{pct(stops, 0.99):.1f} ms (target < {TARGET_STOP_P99_MS:g} ms): "
            f"{'met' if stop_met else 'NOT met'}"
        )
    return 0 if overhead_met and stop_met else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="60 pairs of each kind, 15 stops")
    parser.add_argument("--serve-provider", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve_provider:
        serve_provider(options.port)
        sys.exit(0)
    options.pairs, options.stops, options.warmup = (60, 15, 10) if options.quick else (400, 50, 30)
    sys.exit(run_benchmark(lambda: main(options)))
