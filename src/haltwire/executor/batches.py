"""Requests of the executor's workers sent together: one control-plane write for many intents.

Each worker still claims, checks, performs and settles one intent at a time; a ``Batcher``
gathers what the workers ask of one kind (claims, checks, outcomes) into one request. The first
worker to ask while no request of that kind is on its way leads: it waits ``linger_s`` (0: one
pass of the event loop, so that workers woken together ask together), takes up to ``most``
requests (its own first), sends them and hands each its answer. Workers that ask meanwhile
queue for the next request, which the first of them leads. So a request waits at most for the
one before it (and ``linger_s``): a check is never held back longer than one round trip.

A request that fails as a whole (the control plane unreachable) fails for each of its workers,
which ask again as they did alone. A leader cancelled mid-request fails its batch's other
workers with ``ControlUnreachable`` (what their request did is not known, as for one
abandoned alone), and a queued worker that is cancelled leaves the queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar, cast

import anyio

from haltwire.runtime.client import ControlRefused, ControlUnreachable

A = TypeVar("A")
R = TypeVar("R")


class Tally:
    """Requests of one kind sent and the items they carried: for tests and the benchmark."""

    def __init__(self) -> None:
        self.sent = 0
        self.items = 0

    def add(self, items: int) -> None:
        self.sent += 1
        self.items += items


class _Ask(Generic[A, R]):
    __slots__ = ("answered", "error", "item", "lead", "result", "woken")

    def __init__(self, item: A) -> None:
        self.item = item
        self.woken = anyio.Event()
        self.lead = False
        self.answered = False
        self.result: R | None = None
        self.error: BaseException | None = None


class Batcher(Generic[A, R]):
    """``await batcher.ask(item)``: ``send(items)`` answers each item, in order, with its result
    (a ``ControlRefused`` in place of a result is raised to that item's worker alone)."""

    def __init__(
        self,
        send: Callable[[list[A]], Awaitable[Sequence[R | ControlRefused]]],
        *,
        most: int,
        linger_s: float,
    ) -> None:
        if most < 1:
            raise ValueError("a batch holds at least one request")
        self._send = send
        self.most = most
        self.linger_s = linger_s
        self._queue: list[_Ask[A, R | ControlRefused]] = []
        self._leading = False
        #: Requests sent and the items they carried (``sent``, ``items``).
        self.tally = Tally()

    @property
    def sent(self) -> int:
        return self.tally.sent

    @property
    def items(self) -> int:
        return self.tally.items

    async def ask(self, item: A) -> R:
        entry: _Ask[A, R | ControlRefused] = _Ask(item)
        self._queue.append(entry)
        if not self._leading:
            self._leading = entry.lead = True
        try:
            while not entry.answered:
                if entry.lead:
                    await self._lead(entry)
                else:
                    await entry.woken.wait()
                    entry.woken = anyio.Event()  # the flags say why it woke
        except BaseException:
            if entry in self._queue:  # cancelled before it was sent
                self._queue.remove(entry)
            if entry.lead:  # cancelled as the next leader: the lead goes on
                self._hand_on()
            raise
        if entry.error is not None:
            raise entry.error
        if isinstance(entry.result, ControlRefused):
            raise entry.result
        return cast(R, entry.result)

    async def _lead(self, entry: _Ask[A, R | ControlRefused]) -> None:
        """Send one batch, the leader's own request first in it; then hand the lead on."""
        batch: list[_Ask[A, R | ControlRefused]] = []
        try:
            await anyio.sleep(self.linger_s)  # 0: the workers woken with this one ask first
            batch, self._queue = self._queue[: self.most], self._queue[self.most :]
            results = await self._send([e.item for e in batch])
            if len(results) != len(batch):
                raise ControlUnreachable(f"a batch of {len(batch)} was answered with {len(results)}")
            for e, result in zip(batch, results, strict=True):
                e.result = result
        except Exception as exc:
            for e in batch:
                e.error = exc
        except BaseException:
            lost = ControlUnreachable("the batch's request was abandoned; what it did is not known")
            for e in batch:
                e.error = lost
            raise
        finally:
            entry.lead = False
            if batch:
                self.tally.add(len(batch))
            for e in batch:
                e.answered = True
                e.woken.set()
            self._hand_on()

    def _hand_on(self) -> None:
        """The first queued request leads the next batch; with none queued, nobody leads."""
        for e in self._queue:
            e.lead = False
        if self._queue:
            first = self._queue[0]
            first.lead = True
            first.woken.set()
        else:
            self._leading = False
