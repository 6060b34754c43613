"""Many runs in one runtime, renewed together.

``LeasePool.open(control)`` owns three tasks for all of its runs: one batched renewal
(``POST /v1/leases/renew``, up to 1,000 runs a request) every renewal interval, one expiry
sweep, and one watch follower (push). Each run's ``Lease`` behaves as a standalone one:
``require()``, ``ended`` and ``Guard`` work the same; only who renews it differs. The
same rules hold: a refusal ends a run at once, a failed or timed-out batch extends no run,
and expiry is judged on the local monotonic clock from when the batch was sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Final

import anyio
import anyio.abc

from haltwire.errors import unwrapped
from haltwire.limits import MAX_ITEMS
from haltwire.runtime.client import ControlClient, ControlUnreachable
from haltwire.runtime.lease import Lease, StopNotice, follow_stops

log = logging.getLogger("haltwire.runtime")

#: The control plane's cap on runs per batched renewal.
MAX_BATCH: Final = MAX_ITEMS
#: How often leases past their local deadline are ended (``require()`` is exact regardless).
SWEEP_S: Final = 0.1


class LeasePool:
    def __init__(
        self,
        control: ControlClient,
        tg: anyio.abc.TaskGroup,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        push: bool = True,
    ) -> None:
        self.control = control
        self._tg = tg
        self._monotonic = monotonic
        self._push = push
        self._leases: dict[str, Lease] = {}
        self._watching = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        control: ControlClient,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        push: bool = True,
    ) -> AsyncIterator[LeasePool]:
        with unwrapped():  # the block's own exception comes out as itself
            async with anyio.create_task_group() as tg:
                pool = cls(control, tg, monotonic=monotonic, push=push)
                tg.start_soon(pool._renew_forever)
                tg.start_soon(pool._sweep_forever)
                try:
                    yield pool
                finally:
                    tg.cancel_scope.cancel()  # the pool's tasks end with the block

    async def start_run(
        self,
        *,
        run_id: str | None = None,
        tools: Sequence[str] = (),
        agent_class: str = "default",
        resume_from: str | None = None,
    ) -> Lease:
        """Register a run whose lease this pool renews; ``StopRequested`` if a stop matches it."""
        lease = await Lease.register(
            self.control,
            run_id=run_id,
            tools=tools,
            agent_class=agent_class,
            resume_from=resume_from,
            monotonic=self._monotonic,
        )
        self._leases[lease.run_id] = lease
        if self._push and not self._watching:
            self._watching = True
            self._tg.start_soon(self._watch, lease.generation)
        return lease

    def live(self) -> list[Lease]:
        """The runs whose leases still hold (ended ones are dropped)."""
        for run_id in [r for r, lease in self._leases.items() if lease.notice is not None]:
            del self._leases[run_id]
        return list(self._leases.values())

    def __len__(self) -> int:
        return len(self.live())

    async def _watch(self, since: int) -> None:
        try:
            await follow_stops(self.control, since, self.live)
        finally:
            self._watching = False  # the next run started restarts it

    async def _renew_forever(self) -> None:
        while True:
            live = self.live()
            interval = min((lease.renew_every_s for lease in live), default=SWEEP_S)
            await anyio.sleep(interval)
            live = self.live()
            if not live:
                continue
            sent = self._monotonic()
            for start in range(0, len(live), MAX_BATCH):
                await self._renew(live[start : start + MAX_BATCH], sent, interval)

    async def _renew(self, leases: list[Lease], sent: float, budget: float) -> None:
        try:
            # A batch slower than the interval is abandoned: its answers would be stale.
            with anyio.fail_after(budget):
                renewals = await self.control.renew_many([lease.run_id for lease in leases])
        except (ControlUnreachable, TimeoutError) as exc:
            log.warning("batched renewal of %d runs failed (%s); no lease is extended", len(leases), exc)
            return
        for lease in leases:
            grant = renewals.granted.get(lease.run_id)
            if grant is not None:
                lease._granted(grant, sent)
            elif (error := renewals.refused.get(lease.run_id)) is not None:
                lease._end(StopNotice.from_error(error))

    async def _sweep_forever(self) -> None:
        while True:
            now = self._monotonic()
            for lease in self.live():
                if now >= lease.deadline:
                    lease._end(lease._ran_out())
            await anyio.sleep(SWEEP_S)
