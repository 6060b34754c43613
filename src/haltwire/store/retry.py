"""Store writes that failed and are safe to repeat, retried by one task until they succeed.

A store hands a failed write here only when repeating it is harmless: releasing a slot
(removing an id no one else holds) or recording a call's outcome (setting the same value
again). Admissions and claims are never retried: a repeat whose first reply was lost would
count twice.

``run`` is the one task that retries, started in a task group of the process that owns the
store (the gateway's lifespan) and ending with it. It attempts every waiting write in turn,
oldest first; at the first failure it backs off (doubling, capped) and starts again. A write
is given up at its deadline, past which the store's own expiry has done its work (a slot
expires after ``slot_ttl_s``). At most ``capacity`` writes wait; past that, or while no task
runs, ``add`` refuses and the caller reports the failure as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

log = logging.getLogger("haltwire.store")

#: One attempt at a write: True once it is done, False when it failed (it is tried again).
Attempt = Callable[[], Awaitable[bool]]


class Retries:
    def __init__(
        self,
        what: str,
        *,
        first_delay_s: float = 0.05,
        max_delay_s: float = 2.0,
        capacity: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self._first_delay_s = first_delay_s
        self._max_delay_s = max_delay_s
        self._capacity = capacity
        self._clock = clock
        # key -> (attempt, give up at); dicts keep insertion order, so the oldest goes first.
        self._waiting: dict[str, tuple[Attempt, float]] = {}
        self._wake: anyio.Event | None = None
        #: Writes done by a retry, and writes given up at their deadline.
        self.done = 0
        self.given_up = 0

    @property
    def running(self) -> bool:
        return self._wake is not None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def add(self, key: str, attempt: Attempt, give_up_after_s: float) -> bool:
        """Retry ``attempt`` until it succeeds or ``give_up_after_s`` pass; a later ``add`` of
        the same key replaces it. False (nothing queued) when no task runs or the queue is full."""
        if self._wake is None or (key not in self._waiting and len(self._waiting) >= self._capacity):
            return False
        self._waiting[key] = (attempt, self._clock() + give_up_after_s)
        self._wake.set()
        return True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._wake = anyio.Event()
        task_status.started()
        delay = self._first_delay_s
        try:
            while True:
                if not self._waiting:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                if await self._attempt_all():
                    delay = self._first_delay_s
                else:
                    await anyio.sleep(delay)
                    delay = min(delay * 2, self._max_delay_s)
        finally:
            if self._waiting:
                log.warning(
                    "%d %s(s) not done at shutdown; they expire by themselves", self.waiting, self.what
                )
            self._wake = None

    async def _attempt_all(self) -> bool:
        """One attempt at each waiting write, oldest first; False at the first that fails."""
        for key, (attempt, give_up_at) in list(self._waiting.items()):
            if self._clock() >= give_up_at:
                self._forget(key, attempt)
                self.given_up += 1
                log.warning("gave up the %s of %s at its deadline; it expires by itself", self.what, key)
                continue
            if not await attempt():
                return False
            self._forget(key, attempt)
            self.done += 1
        return True

    def _forget(self, key: str, attempt: Attempt) -> None:
        # Unless the key was added again meanwhile: that newer write still waits.
        entry = self._waiting.get(key)
        if entry is not None and entry[0] is attempt:
            del self._waiting[key]
