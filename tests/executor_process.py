"""The executor as a separate OS process that a test can ``kill -9``.

``python -m haltwire executor`` spends about a second importing before it does anything, too
slow for a test that kills a hundred executors. ``ExecutorProcesses`` starts them from a fork
server instead: one process that has imported the executor, MCP and httpx once, and forks a
ready child per start. Each child runs ``run_executor`` on a gateway config dict until it is
killed; ``Process.kill()`` is SIGKILL, nothing in the child gets to clean up.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.process
from typing import Any, Final

#: What the fork server imports once, so a forked child starts with it loaded.
PRELOAD: Final = [
    "__main__",
    "anyio",
    "httpx2",
    "mcp",
    "mcp.client.streamable_http",
    "haltwire.config",
    "haltwire.executor",
    "executor_process",
]


def run(config: dict[str, Any]) -> None:
    """The child: the executor of ``config`` until the process dies (quiet: warnings and up
    would fill the test's output with the restarts' expected "unknown outcome" lines)."""
    import anyio

    from haltwire.executor import run_executor
    from haltwire.gateway.config import parse_config

    logging.basicConfig(level=logging.CRITICAL)
    anyio.run(run_executor, parse_config(config))


class ExecutorProcesses:
    """Starts executor processes from one fork server (the first ``start`` starts the server)."""

    def __init__(self) -> None:
        self._ctx: multiprocessing.context.ForkServerContext = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)

    def start(self, config: dict[str, Any]) -> multiprocessing.process.BaseProcess:
        process = self._ctx.Process(target=run, args=(config,), daemon=True)
        process.start()
        return process
