"""Running ``haltwire drill`` as a command, and a running stack for it to drill, for the drill's tests."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomli_w

from haltwire.demo.processes import Processes
from haltwire.drill.stack import TOKENS, control_config, gateway_config
from ports import free_ports


def drill(*args: str, timeout: float = 90, embedded: bool = True) -> subprocess.CompletedProcess[str]:
    """``haltwire drill [--embedded] ARGS`` to its exit; past ``timeout``, SIGTERM (the drill
    takes its stack down on it) and the test fails."""
    command = [sys.executable, "-m", "haltwire", "drill", *(["--embedded"] if embedded else []), *args]
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.terminate()
            out, err = child.communicate(timeout=30)
            pytest.fail(f"the drill ran past {timeout:g} s; its stderr:\n{err}")
    return subprocess.CompletedProcess(command, child.returncode, out, err)


#: The running stack's identities beside the drill's: a real operator, a real agent elsewhere.
OPS_TOKEN = "tok-real-operator"
REAL_AGENT = {"name": "acme-worker", "role": "agent", "agent": "worker", "tenant": "acme", "token": "tok-acme"}


@dataclass
class StackToDrill:
    """A running control plane and gateway (the drill's configs, and real identities beside),
    whose gateway routes ``canary_write`` to ``canary_port``, where nothing listens now."""

    admin_url: str
    agents_url: str
    gateway_url: str
    canary_port: int

    def token_file(self, directory: Path, **tokens: str) -> Path:
        """The drill's token file (its identities of ``drill.stack``, unless ``tokens`` says)."""
        path = directory / "drill-tokens.toml"
        path.write_text(tomli_w.dumps({"operator": TOKENS["operator"], "runtime": TOKENS["runtime"], "agent": TOKENS["agent"], **tokens}))
        return path

    def args(self, token_file: Path) -> list[str]:
        return [
            "--control", self.admin_url, "--agents", self.agents_url, "--gateway", self.gateway_url,
            "--token-file", str(token_file), "--canary-port", str(self.canary_port),
        ]  # fmt: skip


def unused_port() -> int:
    """A free loopback port below Linux's ephemeral range (32768 up), for a port a test names
    long before anything listens on it: a free port of that range can become the local port of
    any connection made meanwhile (it did: the canary then failed to bind it)."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@contextmanager
def stack_to_drill(directory: Path) -> Iterator[StackToDrill]:
    """The control plane (SQLite) and a gateway following it, each its own process."""
    control, admin, enforcement, gateway = free_ports(4)
    canary = unused_port()  # unbound for most of the test: outside the range connections draw from
    data = control_config(directory / "control.db", control, admin, enforcement)
    data["identities"] += [{"name": "ops", "role": "operator", "token": OPS_TOKEN}, REAL_AGENT]
    (directory / "control.toml").write_text(tomli_w.dumps(data))
    url = "http://127.0.0.1:{}".format
    gw = gateway_config(gateway, url(enforcement), url(canary), broken=False)
    (directory / "gateway.toml").write_text(tomli_w.dumps(gw))
    processes = Processes(directory)
    try:
        cp = processes.spawn("control plane", "-m", "haltwire", "control", "--config", str(directory / "control.toml"))
        for port in (control, admin, enforcement):
            cp.wait_http(f"{url(port)}/healthz")
        # A gateway starts only with every upstream there: a canary first, as a user's would be,
        # gone again before the drill (which starts its own there: the gateway reconnects).
        first = processes.spawn("first canary", "-m", "haltwire.drill.canary", "--port", str(canary))
        first.wait_http(f"{url(canary)}/record")
        gateway_process = processes.spawn(
            "gateway", "-m", "haltwire", "gateway", "--config", str(directory / "gateway.toml")
        )
        gateway_process.wait_http(f"{url(gateway)}/readyz")
        first.process.terminate()
        first.process.wait(10)
        yield StackToDrill(url(admin), url(control), url(gateway), canary)
    finally:
        processes.close()
