"""The control plane's two processes, so that nothing an agent fleet does delays a stop.

``haltwire control`` serves the admin listener (operators, tripwires, viewers) and the
enforcement listener (gateways, executors) itself, and the agents' listener from a child process
(``AgentsProcess``). What an agent flood costs (renewal batches, connection churn, watch
replays) is spent in that child, which the OS schedules apart: a stop's request, and its push to
the gateways that follow the enforcement listener, never wait behind it on one event loop
(``benchmarks/siege.py``).

Both processes open the same stores, which serialize writers across processes, and each wakes
the other's watchers after it writes a registry change: on PostgreSQL the registry's
LISTEN/NOTIFY does it, as between replicas; on SQLite, one byte on a socket pair between the two
(``Plane.peers``). The socket pair is also the child's lifeline: once the main process is gone
(killed), the child exits at once, so no orphan keeps the agents' port. The main process starts
another child when one exits, and stops it (gracefully, and waits for it) when it stops itself.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc

from haltwire.control import AdminOnly, AgentsListener, ControlConfig, EnforcementOnly, create_app
from haltwire.control.broker import BrokerKeys
from haltwire.control.plane import Plane
from haltwire.control.stores import open_stores
from haltwire.listener import InFlightCap
from haltwire.serve import serve_forever, serve_listeners

log = logging.getLogger("haltwire.control")

#: The hidden option that makes ``haltwire control`` the agents' process: ``FD,FD`` (the
#: listening socket and the child's end of the socket pair, inherited).
AGENTS_PROCESS_OPTION: Final = "--agents-process"
#: Streams exempt from the in-flight caps (each is in flight for as long as it is open): the
#: watch, and the dashboard's live stream.
STREAMS: Final = frozenset({"/v1/watch", "/dashboard/events"})
#: Before another child is started after one exited (a crash loop costs one start a second).
RESTART_S: Final = 1.0
#: How long a stopping child may take to finish what it is answering before it is killed.
STOP_S: Final = 10.0
#: The child's exit status when the main process is gone.
ORPHANED: Final = 1


def tell(peer: socket.socket) -> None:
    """One wake-up to the other process: the registry has a change it did not write."""
    try:
        peer.send(b"w")
    except (BlockingIOError, InterruptedError):
        pass  # its buffer is full of wake-ups not yet read: one more adds nothing
    except OSError:
        pass  # gone: the lifeline (or the restart) deals with that


async def heard(peer: socket.socket, plane: Plane) -> None:
    """Wake ``plane``'s watchers at each wake-up from the other process; returns when its end
    of the pair is closed (it exited)."""
    while True:
        await anyio.wait_readable(peer)
        try:
            data = peer.recv(4096)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            return
        if not data:
            return
        plane.wake()


class AgentsProcess:
    """The child that serves the agents' listener: started, woken, restarted and stopped by the
    main process (``run`` until cancelled, ``stop``)."""

    def __init__(
        self, config_path: Path, sock: socket.socket, plane: Plane, wakes: bool, verbose: bool
    ) -> None:
        self.config_path = config_path
        self.sock = sock
        self.plane = plane
        self.verbose = verbose
        self.proc: anyio.abc.Process | None = None
        self._peer: socket.socket | None = None
        self._stopping = False
        if wakes:
            plane.peers.append(self._tell)

    def _tell(self) -> None:
        if self._peer is not None:
            tell(self._peer)

    async def run(self) -> None:
        """Keep a child serving the agents' listener, until cancelled or ``stop``."""
        while not self._stopping:
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            try:
                with theirs:
                    fds = (self.sock.fileno(), theirs.fileno())
                    self.proc = await anyio.open_process(
                        [
                            sys.executable,
                            "-m",
                            "haltwire",
                            *(["--verbose"] if self.verbose else []),
                            "control",
                            "--config",
                            str(self.config_path),
                            AGENTS_PROCESS_OPTION,
                            ",".join(map(str, fds)),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=None,
                        stderr=None,
                        pass_fds=fds,
                    )
                print(
                    f"haltwire control: the agents' listener is served by process {self.proc.pid}",
                    file=sys.stderr,
                    flush=True,
                )
                self._peer = ours
                await heard(ours, self.plane)  # until the child's end closes: it is exiting
                code = await self.proc.wait()
            finally:
                self._peer = None
                ours.close()
                with anyio.CancelScope(shield=True):
                    await self._end()
            if not self._stopping:
                log.error(
                    "the agents' listener process exited (%s); starting another in %g s", code, RESTART_S
                )
                await anyio.sleep(RESTART_S)

    async def stop(self) -> None:
        """No new child; the running one finishes what it is answering (SIGTERM) and exits."""
        self._stopping = True
        await self._end()

    async def _end(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        with anyio.move_on_after(STOP_S):
            await proc.wait()
            return
        proc.kill()
        await proc.wait()


async def serve_main(
    config: ControlConfig,
    config_path: Path,
    agents: socket.socket,
    admin: socket.socket,
    enforcement: socket.socket,
    verbose: bool = False,
    opened: Callable[[], None] | None = None,
) -> None:
    """The main process: the admin and enforcement listeners, and the agents' process, until
    SIGINT/SIGTERM. The stores are opened here, not in the app's lifespan, so an unreachable
    store is the command's exit status (``RegistryUnavailable``); ``opened`` is called once they
    are (the command announces its URLs then, not before)."""
    section = config.control
    if config.broker is not None and config.broker.generate:
        BrokerKeys.from_config(config.broker).share_generated()  # one key for both processes
    async with open_stores(config) as stores:
        if opened is not None:
            opened()
        app = create_app(config, stores)
        child = AgentsProcess(
            config_path, agents, app.state.plane, config.registry.backend == "sqlite", verbose
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(child.run)
            await serve_listeners(
                [
                    (
                        InFlightCap(AdminOnly(app), section.admin_listener.max_in_flight, STREAMS),
                        admin,
                        section.admin_listener,
                    ),
                    (
                        InFlightCap(
                            EnforcementOnly(app), section.enforcement_listener.max_in_flight, STREAMS
                        ),
                        enforcement,
                        section.enforcement_listener,
                    ),
                ],
                stopping=child.stop,
            )
            tg.cancel_scope.cancel()


async def serve_agents(config: ControlConfig, fds: str) -> None:
    """The agents' process: the agents' listener on the inherited socket, until SIGINT/SIGTERM,
    or until the main process is gone."""
    listening, pair = (int(fd) for fd in fds.split(","))
    sock = socket.socket(fileno=listening)
    peer = socket.socket(fileno=pair)
    peer.setblocking(False)
    limits = config.control.agent_listener
    async with open_stores(config) as stores:
        # The main process runs the background rules and sends the pages.
        app = create_app(config, stores, rules=False, pages=False)
        plane: Plane = app.state.plane
        if config.registry.backend == "sqlite":
            plane.peers.append(lambda: tell(peer))
        async with anyio.create_task_group() as tg:
            tg.start_soon(_lifeline, peer, plane)
            await serve_forever(InFlightCap(AgentsListener(app), limits.max_in_flight, STREAMS), sock, limits)
            tg.cancel_scope.cancel()


async def _lifeline(peer: socket.socket, plane: Plane) -> None:
    await heard(peer, plane)
    # The main process is gone (killed: it stops us itself otherwise), and its listeners with it:
    # exit now, as one process would have, rather than serve agents with no way to stop them.
    print(
        "haltwire control: the main process is gone; the agents' listener exits", file=sys.stderr, flush=True
    )
    os._exit(ORPHANED)
