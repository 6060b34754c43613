"""Real processes for gateway tests: the demo upstream, gateways from a written config, and
their teardown. Every process a test starts is killed by ``Processes.stop_all``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ports import free_port

HALTWIRE = [sys.executable, "-c", "from haltwire.cli import main; main()"]
AGENT, TOKEN = "fleet-bot", "tok-fleet"
#: A window that does not end during a test run (it ends in 2033).
WINDOW_S = 1_000_000_000
START_TIMEOUT_S = 45.0


# -- processes ------------------------------------------------------------------------------


class Processes:
    """Every subprocess a test starts; ``stop_all`` kills the ones still running."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: Leaders of process groups (``start_new_session``): their whole group is killed.
        self.groups: list[int] = []

    def spawn(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        assert name not in self.procs, name
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with (self.logs / f"{name}.log").open("wb") as log:
            stdout = kwargs.pop("stdout", log)
            proc = subprocess.Popen(argv, stdout=stdout, stderr=log, env=env, **kwargs)
        self.procs[name] = proc
        if kwargs.get("start_new_session"):
            self.groups.append(proc.pid)
        return proc

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop_all(self) -> None:
        for pgid in self.groups:
            leader = next(p for p in self.procs.values() if p.pid == pgid)
            # A leader that exited 0 has waited for all its children: nothing left to kill.
            if leader.poll() != 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + 5
        for p in running:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for p in self.procs.values():
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()


def http_get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_ready(procs: Processes, name: str, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 200; fail early, with the log, if the process exits."""
    proc = procs.procs[name]
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}:\n{procs.log_tail(name)}")
        try:
            http_get_json(url, timeout=0.5)
            return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{name} was not ready within {timeout_s} s:\n{procs.log_tail(name)}")
        time.sleep(0.05)


@dataclass
class Upstream:
    name: str
    port: int

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def total_served(self) -> int:
        served: int = http_get_json(f"http://127.0.0.1:{self.port}/state")["total_served"]
        return served


def spawn_upstream(procs: Processes, name: str) -> Upstream:
    up = Upstream(name, free_port())
    procs.spawn(name, [*HALTWIRE, "demo", "upstream", "--port", str(up.port)])
    return up


@dataclass
class Gateway:
    name: str
    port: int
    config: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def healthz(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    @property
    def readyz(self) -> str:
        """200 once its upstream is connected (``/healthz`` answers while it starts)."""
        return f"http://127.0.0.1:{self.port}/readyz"


def write_config(
    path: Path,
    *,
    port: int,
    upstream: Upstream,
    backend: str,
    redis_url: str | list[str] = "",
    cluster: bool = False,
    prefix: str = "",
    budget: int = 100,
    extra_limits: str = "",
    timeout_s: float = 5.0,
) -> None:
    lines = [
        "[gateway]",
        "development = true",
        'host = "127.0.0.1"',
        f"port = {port}",
        "",
        "[counters]",
        f"backend = {json.dumps(backend)}",
    ]
    if backend == "redis":
        # A generous admission timeout: sixteen processes share two cores here, and an admission
        # that times out is refused although Redis may have counted it (fail closed, by design),
        # which would make "exactly 100 served" 99.
        lines += [
            f"url = {json.dumps(redis_url)}",
            f"prefix = {json.dumps(prefix)}",
            f"timeout_s = {timeout_s}",
        ]
        if cluster:
            lines.append("cluster = true")
    lines += ["", "[limits]", f"budget = {budget}", f"window_s = {WINDOW_S}"]
    if extra_limits:
        lines.append(extra_limits)
    lines += [
        "",
        "[[identities]]",
        f"agent = {json.dumps(AGENT)}",
        f"token = {json.dumps(TOKEN)}",
        "",
        "[[upstreams]]",
        'name = "demo"',
        f"url = {json.dumps(upstream.mcp_url)}",
        'headers = { Authorization = "Bearer upstream-key" }',
    ]
    path.write_text("\n".join(lines) + "\n")


def spawn_gateways(
    procs: Processes, tag: str, n: int, *, ports: list[int] | None = None, **config: Any
) -> list[Gateway]:
    """``n`` gateway processes from ``write_config(**config)``, on ``ports`` or free ones."""
    gateways = []
    for i in range(n):
        port = free_port() if ports is None else ports[i]
        gw = Gateway(f"gateway-{tag}-{i}", port, procs.logs / f"gateway-{tag}-{i}.toml")
        write_config(gw.config, port=gw.port, **config)
        procs.spawn(gw.name, [*HALTWIRE, "gateway", "--config", str(gw.config)])
        gateways.append(gw)
    return gateways


def budget_key(prefix: str) -> str:
    """The Redis key of the fleet identity's budget counter in the current window."""
    # The identity's counters live under TENANT/AGENT@VERSION (Identity.counted_as).
    return f"{prefix}:{{default/{AGENT}@0}}:b:{int(time.time() // WINDOW_S)}"
