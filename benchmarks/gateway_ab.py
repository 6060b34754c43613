"""Two versions of the gateway, one upstream, interleaved: does a change make a call cheaper?

Run from the repository root::

    .venv/bin/python benchmarks/gateway_ab.py main HEAD                  # two git revisions
    .venv/bin/python benchmarks/gateway_ab.py main . --blocks 24         # main against the work tree
    .venv/bin/python benchmarks/gateway_ab.py HEAD HEAD                  # A/A: this machine's noise
    .venv/bin/python benchmarks/gateway_ab.py main HEAD --with direct,floor,core --gap-ms 1.5
    .venv/bin/python benchmarks/gateway_ab.py main HEAD --answer-bytes 15000          # a 15 KB result

A change that saves a few percent of a call's CPU is lost in this kind of machine's noise (its
speed moves by half within the hour) unless both versions are measured in turns: each version
(``src/`` of a revision, exported with ``git archive``; ``.`` is the work tree) runs as its own
``haltwire gateway`` process with ``benchmarks/gateway.py``'s config, every one in front of the
same demo upstream. Blocks of sequential calls by the lean client (``lean_client.py``) go to
each in a rotating order, and each block's on-CPU time of the server (``/proc/PID/task/*/schedstat``,
nanoseconds) gives its CPU per call. The figure to read is the median over blocks of B's CPU
per call over A's in the same turn; run A against itself first to see how far that moves here.

``--answer-bytes N`` pads each tool result by N bytes (reading answers costs per byte; the
default result is tiny). ``--with direct,floor,core,core+edge`` adds the upstream itself, ``floor.py``, ``core.py``
(the work tree's pipeline on the floor's server) and ``core.py --edge`` (the work tree's whole app, every edge
check included, on that server) as rows for scale; ``--gap-ms`` waits between calls (a
gateway woken from idle costs more than a busy one). Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway_common import TOKEN, TOOL
from gateway_servers import gateway_config
from lean_client import LeanClient
from procs import HOST, free_port, load_average, machine_speed, on_cpu_seconds, processes, spawn, wait_ready

SCRIPT_DIR = Path(__file__).resolve().parent
REPO = SCRIPT_DIR.parent


@dataclass
class Row:
    name: str
    url: str
    pid: int
    cpu_ms: list[float] = field(default_factory=list)  # per block: on-CPU ms per call
    p50_ms: list[float] = field(default_factory=list)  # per block


def exported(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` (``.``: the work tree's own) under ``into``, for ``PYTHONPATH``."""
    if rev == ".":
        return REPO / "src"
    target = into
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(f"{rev}: {archive.stderr.decode().strip()}")
    with tempfile.TemporaryFile() as tar:
        tar.write(archive.stdout)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as files:
            files.extractall(target, filter="data")
    return target / "src"


async def block(lean: LeanClient, calls: int, gap_s: float) -> list[float]:
    """``calls`` sequential calls; their latencies in ms (a wrong answer stops the run)."""
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        if not await lean.call(1):
            raise SystemExit("a call was answered wrongly")
        latencies.append(1000 * (time.perf_counter() - started))
        if gap_s:
            await asyncio.sleep(gap_s)
    return latencies


def checked(rev: str, src: Path) -> Path:
    """``src``, once a gateway started with it on ``PYTHONPATH`` is known to import it (an
    installed haltwire that won would compare a version with itself)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import haltwire; print(haltwire.__file__)"
    imported = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if not imported.stdout.startswith(str(src)):
        raise SystemExit(f"{rev}: haltwire is imported from {imported.stdout.strip() or imported.stderr}, not {src}")
    return src


async def run(opts: argparse.Namespace, work: Path, srcs: list[Path]) -> int:
    print(f"gateway A/B: {opts.a} against {opts.b}; load average {load_average()}; {machine_speed()}")
    py = sys.executable
    extra = [w for w in opts.with_.split(",") if w]
    with processes() as procs:
        up_port = free_port()
        upstream = f"http://{HOST}:{up_port}/mcp"
        log = work / "upstream.log"
        serve = [py, str(SCRIPT_DIR / "gateway.py"), "serve", "upstream", "--port", str(up_port)]
        procs.append(spawn([*serve, "--answer-bytes", str(opts.answer_bytes)], log))
        await wait_ready(f"http://{HOST}:{up_port}/state", procs[-1], log)
        config = work / "haltwire.toml"
        config.write_text(gateway_config(upstream))
        rows: list[Row] = []
        for label, rev, src in (("A", opts.a, srcs[0]), ("B", opts.b, srcs[1])):
            port, log = free_port(), work / f"{label}.log"
            cmd = [py, "-m", "haltwire", "gateway", "--port", str(port), "--config", str(config)]
            env = {**os.environ, "PYTHONPATH": str(src)}
            procs.append(spawn(cmd, log, env=env, cwd=work))
            await wait_ready(f"http://{HOST}:{port}/healthz", procs[-1], log)
            rows.append(Row(f"{label}: {rev}", f"http://{HOST}:{port}/mcp", procs[-1].pid))
        if "direct" in extra:
            rows.append(Row("direct", upstream, procs[0].pid))
        if "floor" in extra:
            port, log = free_port(), work / "floor.log"
            cmd = [py, str(SCRIPT_DIR / "gateway.py"), "serve", "floor", "--upstream", upstream, "--port", str(port)]
            procs.append(spawn(cmd, log))
            await wait_ready(f"http://{HOST}:{port}/mcp", procs[-1], log)
            rows.append(Row("floor", f"http://{HOST}:{port}/mcp", procs[-1].pid))
        for name, flags in (("core", []), ("core+edge", ["--edge"])):
            if name in extra:
                port, log = free_port(), work / f"{name}.log"
                cmd = [py, str(SCRIPT_DIR / "core.py"), "--config", str(config), "--port", str(port), *flags]
                procs.append(spawn(cmd, log, cwd=work))
                await wait_ready(f"http://{HOST}:{port}/mcp", procs[-1], log)
                rows.append(Row(name, f"http://{HOST}:{port}/mcp", procs[-1].pid))
        orders = itertools.count(1)
        leans = [
            LeanClient(r.url, {"authorization": f"Bearer {TOKEN}"}, TOOL, 1, orders) for r in rows
        ]
        for lean in leans:
            await lean.__aenter__()
        try:
            for lean in leans:  # warm-up: imports, connections, caches
                await block(lean, 100, 0)
            for b in range(opts.blocks):
                for i in ((k + b) % len(rows) for k in range(len(rows))):
                    before = on_cpu_seconds(rows[i].pid)
                    latencies = await block(leans[i], opts.calls, opts.gap_ms / 1000)
                    rows[i].cpu_ms.append(1000 * (on_cpu_seconds(rows[i].pid) - before) / opts.calls)
                    rows[i].p50_ms.append(statistics.median(latencies))
                print(f"  block {b + 1}/{opts.blocks}", end="\r", file=sys.stderr, flush=True)
        finally:
            print(file=sys.stderr)
            for lean in leans:
                await lean.__aexit__(None, None, None)
    print(f"{opts.blocks} blocks of {opts.calls} sequential calls each, gap {opts.gap_ms:g} ms, lean client")
    print(f"    {'server':<24} {'CPU ms/call':>11} {'p50 ms':>8}   (medians over blocks)")
    for r in rows:
        print(f"    {r.name:<24} {statistics.median(r.cpu_ms):>11.3f} {statistics.median(r.p50_ms):>8.3f}")
    first, second = rows[0], rows[1]
    cpu = [y / x for x, y in zip(first.cpu_ms, second.cpu_ms, strict=True)]
    p50 = [y / x for x, y in zip(first.p50_ms, second.p50_ms, strict=True)]
    print(
        f"B over A, per turn: CPU per call {statistics.median(cpu):.3f}x (blocks {min(cpu):.2f}-{max(cpu):.2f}), "
        f"p50 {statistics.median(p50):.3f}x (blocks {min(p50):.2f}-{max(p50):.2f})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", help="a git revision, or . for the work tree")
    parser.add_argument("b", help="a git revision, or . for the work tree")
    parser.add_argument("--blocks", type=int, default=12, help="turns (default 12)")
    parser.add_argument("--calls", type=int, default=200, help="sequential calls per block (default 200)")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between calls")
    parser.add_argument(
        "--answer-bytes", type=int, default=0, help="pad each tool result's text by this many bytes (default 0)"
    )
    parser.add_argument("--with", dest="with_", default="", help="rows for scale: direct, floor, core, core+edge")
    opts = parser.parse_args(argv)
    if opts.blocks < 1 or opts.calls < 1:
        parser.error("--blocks and --calls must be at least 1")
    unknown = {w for w in opts.with_.split(",") if w} - {"direct", "floor", "core", "core+edge"}
    if unknown:
        parser.error(f"--with takes direct, floor, core and core+edge, not {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="haltwire-ab-") as tmp:
        work = Path(tmp)
        srcs = [checked(rev, exported(rev, work / label)) for label, rev in (("A", opts.a), ("B", opts.b))]
        return asyncio.run(run(opts, work, srcs))


if __name__ == "__main__":
    sys.exit(main())
