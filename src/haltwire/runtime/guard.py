"""The guard around model calls and tool calls: level 2 of the stop ladder.

``await guard.call(fn)`` checks the lease, runs ``fn(token)``, and checks the lease again
after it returns (the call may have outlived the lease). While ``fn`` runs, the lease
ending (a pushed stop, a refused renewal, running out) cancels it: anyio cancellation, so
an HTTP request in flight is closed and an MCP upstream sees the cancellation, rather than
the stop waiting for the call to finish on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from haltwire.errors import unwrapped
from haltwire.runtime.lease import Lease, StopNotice, StopRequested

T = TypeVar("T")


class Guard:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    async def call(self, fn: Callable[[str], Awaitable[T]]) -> T:
        """``fn(lease_token)``, cancelled if the lease ends first; ``StopRequested`` then."""
        token = self.lease.require()
        outcome: list[T] = []
        # The task group owns fn; this task waits for the lease to end. Whichever comes
        # first cancels the other.
        with unwrapped():  # fn's own exception comes out as itself
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    outcome.append(await fn(token))
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                await self.lease.ended.wait()
                tg.cancel_scope.cancel()
        if not outcome:
            raise StopRequested(self.lease.notice or StopNotice("stopped", "the lease ended"))
        self.lease.require()
        return outcome[0]
