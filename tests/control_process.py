"""``python -m haltwire control`` as a process a test starts and signals, on three known ports
(agents, admin, enforcement), with a slow heartbeat so only a push arrives soon."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import tomli_w

from control_harness import config_dict as control_config
from ports import free_ports

HEARTBEAT_S = 30.0
LISTENERS = ("agents", "admin", "enforcement")


class ControlCommand:
    """``python -m haltwire control`` on three known ports, started and signalled by the test."""

    def __init__(self, directory: Path, registry: dict[str, Any]) -> None:
        self.ports = dict(zip(LISTENERS, free_ports(len(LISTENERS)), strict=True))
        data = control_config(registry, HEARTBEAT_S)
        data["control"] |= {
            "port": self.ports["agents"],
            "admin_port": self.ports["admin"],
            "enforcement_port": self.ports["enforcement"],
        }
        data["broker"] = {"ttl_s": 300, "audiences": ["orders"], "generate": True}
        self.config = directory / "control.toml"
        self.config.write_text(tomli_w.dumps(data))
        self.log = directory / "control.log"
        self.proc: anyio.abc.Process | None = None

    def url(self, listener: str) -> str:
        return f"http://127.0.0.1:{self.ports[listener]}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = await anyio.open_process(
                [sys.executable, "-m", "haltwire", "control", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        for listener in LISTENERS:
            await self.answers(listener, within=30)

    async def answers(self, listener: str, within: float) -> None:
        async with httpx2.AsyncClient(timeout=2) as http:
            with anyio.fail_after(within):
                while True:
                    assert self.proc is not None and self.proc.returncode is None, self.log.read_text()
                    try:
                        if (await http.get(f"{self.url(listener)}/healthz")).status_code == 200:
                            return
                    except httpx2.TransportError:
                        pass
                    await anyio.sleep(0.05)

    def children(self) -> list[int]:
        """The agents' processes the command said it started, oldest first."""
        return [int(pid) for pid in re.findall(r"served by process (\d+)", self.log.read_text())]

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            with anyio.CancelScope(shield=True):
                await self.proc.wait()


@asynccontextmanager
async def control_command(directory: Path, registry: dict[str, Any]) -> AsyncIterator[ControlCommand]:
    command = ControlCommand(directory, registry)
    try:
        await command.start()
        yield command
    finally:
        await stopped(command)


async def stopped(command: ControlCommand) -> None:
    """Stop ``command`` and make sure its children are gone too."""
    await command.stop()
    for pid in command.children():  # the lifeline ends them; a failed test must not leak one
        with anyio.move_on_after(5):
            while alive(pid):
                await anyio.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its parent, the command, is what reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
