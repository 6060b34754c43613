"""``haltwire`` commands run to their exit as processes forked from a server that imported the
CLI once.

``python -m haltwire`` spends about two seconds of CPU importing the gateway and MCP before it
reads its arguments; the tests that only check how a command exits (a config error, a refused
token) run dozens of them. Each still runs in a process of its own, with its own environment,
working directory, exit status, standard output and error, as ``python -m haltwire`` would.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.context
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import anyio.to_thread

#: What the fork server imports once: the CLI, and what its commands import when they run.
PRELOAD = [
    "haltwire.cli",
    "haltwire.control",
    "haltwire.control.stores",
    "haltwire.control_processes",
    "haltwire.executor",
    "haltwire.gateway",
    "haltwire.listener",
    "haltwire.serve",
    "haltwire.store.registry",
    "haltwire.tripwires.backtest",
]

_context: multiprocessing.context.ForkServerContext | None = None


def _server() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _command(args: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The child: ``haltwire ARGS`` with stdin from /dev/null and stdout, stderr to files."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["haltwire", *args]
    from haltwire.cli import main

    try:
        main(args)  # exits through SystemExit, whose code is the process's exit status
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_haltwire(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``haltwire ARGS`` to its exit: its status, stdout and stderr, as ``subprocess.run``
    with ``capture_output=True, text=True`` answers them. ``env``: the whole environment."""
    with tempfile.TemporaryDirectory(prefix="haltwire-cli-") as directory:
        out, err = Path(directory) / "stdout", Path(directory) / "stderr"
        out.touch()
        err.touch()
        child = _server().Process(
            target=_command,
            args=(list(args), dict(os.environ if env is None else env), str(cwd or Path.cwd()), str(out), str(err)),
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["haltwire", *args], timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(["haltwire", *args], child.exitcode, out.read_text(), err.read_text())


async def run_haltwire_async(*args: str) -> subprocess.CompletedProcess[str]:
    """``run_haltwire`` from async code (60 s at most): it waits in a worker thread, so the servers
    the command talks to (in the test's event loop) keep serving."""
    return await anyio.to_thread.run_sync(functools.partial(run_haltwire, *args, timeout=60))
