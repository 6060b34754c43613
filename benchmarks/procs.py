"""What the benchmarks share: servers as separate processes, percentiles, machine load.

Each benchmark starts real haltwire (and rival) servers with ``spawn`` inside ``processes``
and waits for them with ``wait_ready``; nothing here measures anything by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2

HOST = "127.0.0.1"


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; NaN for no values."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _reference_work(n: int) -> int:
    seen: dict[int, int] = {}
    total = 0
    for i in range(n):
        seen[i & 1023] = i
        total += len(str(i))
    return total + len(seen)


def machine_speed() -> str:
    """How fast this machine runs Python now: the best of five runs of a fixed pure-Python loop,
    in ms (lower is faster). Milliseconds of two runs compare only as far as this does."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        _reference_work(200_000)
        best = min(best, time.perf_counter() - started)
    return f"reference loop {best * 1000:.0f} ms"


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process, from /proc (Linux; NaN elsewhere or once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def on_cpu_seconds(pid: int) -> float:
    """A process's threads' time on a CPU, in nanoseconds' resolution (``/proc/PID/task/*/schedstat``;
    ``cpu_seconds`` counts in clock ticks, too coarse for a block of a few hundred calls). A
    thread that has ended is no longer counted: for servers whose threads live as long as they do."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
    return total / 1e9


def tree_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of a process and of its live descendants (a control plane's child)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu_seconds(current)
        todo.extend(children.get(current, ()))
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def spawn(
    args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a server, its output to ``log``; ``env`` replaces this process's environment when
    given (a server in another interpreter's venv), ``cwd`` is its working directory."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        # A session of its own: a Ctrl-C reaches the benchmark only, which then stops the
        # servers in order (watchers must not see the control plane vanish first and log errors).
        return subprocess.Popen(
            args,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _read(log: Path) -> str:
    return log.read_text(errors="replace")


async def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    """Wait until ``url`` answers HTTP at all (``timeout_s`` at most), or fail with the server's log."""
    with anyio.move_on_after(timeout_s):
        async with httpx2.AsyncClient(timeout=2.0) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{url}: the server exited ({proc.returncode}):\n{_read(log)}")
                try:
                    # Any HTTP answer will do; streamed, since a GET of an MCP endpoint may be an
                    # SSE stream that never ends.
                    async with http.stream("GET", url, headers={"accept": "application/json"}):
                        return
                except httpx2.TransportError:
                    await anyio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up in {timeout_s:g} s:\n{_read(log)}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc``, killed if it has not exited after 5 s."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Servers started in the block; each is terminated (killed after 5 s) when it exits, however.

    Last started, first stopped: a gateway before the control plane it follows.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_benchmark(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run a benchmark's ``main()``: SIGTERM and Ctrl-C stop the servers and answer 130; a
    ``RuntimeError`` (a server failed, a phase did not finish) is one line and 2."""

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # cleans up the servers as a Ctrl-C does

    signal.signal(signal.SIGTERM, terminated)
    try:
        return asyncio.run(main())
    except BaseException as exc:  # a task group wraps what its tasks raised
        leaves = list(_leaves(exc))
        if any(isinstance(e, KeyboardInterrupt) for e in leaves):
            print("interrupted; the servers were stopped", file=sys.stderr)
            return 130
        if leaves and all(isinstance(e, RuntimeError) for e in leaves):
            for e in leaves:
                print(f"benchmark failed: {e}", file=sys.stderr)
            return 2
        raise


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            yield from _leaves(e)
    else:
        yield exc
