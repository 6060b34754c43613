"""Demo stacks of real processes: start each part of haltwire as its own OS process, wait for it,
and take every one down however the demo ends.

``Processes`` owns the processes it spawns (``python -m ...``, stderr to a file in its
directory). ``close()`` sends SIGTERM to every one, then SIGKILL to those still there after
``GRACE_S``. A process that exits or does not answer while starting raises ``StackFailed``
with the end of its stderr, so the demo can say which part failed and why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx2

#: How long each process may take to come up, and to go down after SIGTERM.
READY_S: Final = 30.0
GRACE_S: Final = 5.0


class StackFailed(Exception):
    """A process of the stack did not start; the message ends with the tail of its stderr."""


def free_ports(n: int) -> list[int]:
    """``n`` different loopback ports free now (another process could take one before ours binds
    it). Each socket is held until all are picked: once one is closed, the kernel may hand its
    port to the next bind, and a stack given one port twice does not start."""
    with ExitStack() as held:
        ports = []
        for _ in range(n):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def free_port() -> int:
    """A loopback port free now (another process could take it before ours binds it)."""
    return free_ports(1)[0]


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failed(self, why: str) -> StackFailed:
        return StackFailed(f"the {self.name} {why}; the end of its stderr ({self.log}):\n{self.tail()}")

    def _starting(self, waited_for: str, deadline: float) -> None:
        if self.process.poll() is not None:
            raise self.failed(f"exited with status {self.process.returncode} on start")
        if time.monotonic() > deadline:
            raise self.failed(f"did not {waited_for} within {READY_S:g} s")

    def wait_http(self, url: str) -> None:
        """Until ``url`` answers 200."""
        deadline = time.monotonic() + READY_S
        with httpx2.Client(timeout=1.0) as http:
            while True:
                try:
                    if http.get(url).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
                self._starting(f"answer {url}", deadline)
                time.sleep(0.05)

    def wait_log(self, line: str) -> None:
        """Until its stderr holds ``line``."""
        deadline = time.monotonic() + READY_S
        while line not in self.tail(200):
            self._starting(f"say {line!r}", deadline)
            time.sleep(0.05)


class Processes:
    """The processes of one demo stack, their stderr files in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.services: list[Service] = []

    def spawn(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Service:
        """Start ``python ARGS`` (this interpreter) as ``name``, with ``env`` added to ours."""
        log = self.directory / f"{name.replace(' ', '-')}.stderr"
        with log.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            )
        service = Service(name, process, log)
        self.services.append(service)
        return service

    def check_alive(self) -> None:
        for service in self.services:
            if service.process.poll() is not None:
                raise service.failed(f"exited with status {service.process.returncode}")

    def stop(self, service: Service) -> None:
        """SIGTERM to one process; ``StackFailed`` if it is still there after the grace period
        (then killed) or exits with a failure."""
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
        try:
            status = service.process.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()
            raise service.failed(f"still running {GRACE_S:g} s after SIGTERM") from None
        if status != 0:
            raise service.failed(f"exited with status {status} on SIGTERM")

    def close(self) -> None:
        """SIGTERM to every process, SIGKILL to those still there after the grace period."""
        for service in reversed(self.services):
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for service in reversed(self.services):
            try:
                service.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait()
