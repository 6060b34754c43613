"""Counters in Redis, shared by several gateways.

Each admission decision is one Lua script (``admit.lua``), so one round trip and atomic
across every gateway: no two gateways can both take the last call of a budget. The same script
takes the tripwires' counts of the call (``Tally``, ``Streak``, ``Repeat``) with the budgets, so
a call's ceilings and admission tripwires cost one round trip together. Slots are
members of a sorted set scored by their expiry, so a gateway that crashes while holding
slots cannot hold them forever: the next admission drops expired members.

Failure is loud: any error, or no answer within ``timeout_s`` (waiting for a pooled
connection included), raises ``CountersUnavailable`` and the gateway refuses the call. An
admission is never retried (a retried admission whose first reply was lost would count the
call twice) and never falls back to counting in memory. A release is retried: removing a
slot id twice is harmless, and a release lost to a transient failure would hold its slot
until ``slot_ttl_s``. The retries run in a task the gateway starts (``start``); without it, a
failed release raises and the slot expires by itself.

Keys: ``PREFIX:{OWNER}:...``, the owner (the first part of a counter's name: an identity, a
tenant or an agent, see ``parts``) a hash tag, so that one owner's counters share a Redis
Cluster slot. Budgets ``:b...`` (``:WINDOW`` appended), slots ``:f...``, run steps ``:r:RUN``,
the tripwires' and usage counts ``:t:...``. On a cluster (``cluster``) an admission is one script
per owner it touches (``parts``: the identity's first, the others given back if a later one
refuses); on one server it is always one script.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
from redis.asyncio.cluster import RedisCluster

from haltwire.store.counters import (
    ADMITTED,
    BudgetCounter,
    CountersUnavailable,
    Decision,
    SlotCounter,
    Streak,
    Tallies,
    Tally,
    TallyOp,
)
from haltwire.store.counters.parts import Part, count_before, parts, refund_args
from haltwire.store.lua import lua_script
from haltwire.store.redis import (
    MAX_CONNECTIONS,
    REDIS_ERRORS,
    RedisClient,
    Script,
    failed,
    ready,
    redis_client,
    warm,
)
from haltwire.store.retry import Retries

log = logging.getLogger("haltwire.store")

# The scripts are .lua files beside this module (their contracts are at their tops).
_ADMIT = lua_script(__package__, "admit.lua")
_RELEASE = lua_script(__package__, "release.lua")
_REFUND = lua_script(__package__, "refund.lua")
#: What refused, by the script's answer.
_REFUSED = {1: "budget", 2: "slots", 3: "tally"}


def _unavailable(exc: BaseException) -> CountersUnavailable:
    return CountersUnavailable(str(exc) or type(exc).__name__)


class RedisCounters:
    releases_at_once = False  # a round trip

    def __init__(
        self,
        url: str | Sequence[str] = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "haltwire",
        slot_ttl_s: float = 300.0,
        timeout_s: float = 0.5,
        max_connections: int = MAX_CONNECTIONS,
        cluster: bool = False,
        client: RedisClient | None = None,
    ) -> None:
        """``client``: a client shared with other stores, closed by its owner, not here.
        ``cluster``: on Redis Cluster (a shared ``client`` says so itself)."""
        self._prefix = prefix
        self._slot_ttl_s = slot_ttl_s
        self._slot_ttl_ms = max(1, round(slot_ttl_s * 1000))
        self._timeout_s = timeout_s
        self._owns_client = client is None
        self._redis = client or redis_client(
            url, timeout_s=timeout_s, max_connections=max_connections, cluster=cluster
        )
        #: One script per owner (see ``parts``), not one for the whole admission.
        self.split = isinstance(self._redis, RedisCluster)
        self._admit = Script(self._redis, _ADMIT)
        self._release = Script(self._redis, _RELEASE)
        self._refund = Script(self._redis, _REFUND)
        #: Releases that failed, retried until done or until their slots have expired.
        self.releases = Retries("slot release")
        #: Round trips made, for the benchmark's "round trips per call" figure.
        self.round_trips = 0

    def _key(self, key: str, kind: str = "") -> str:
        # The owner part of every key is a hash tag, so one owner's counters share a cluster
        # slot and each part's script stays legal on Redis Cluster.
        owner, sep, rest = key.partition(":")
        return f"{self._prefix}:{{{owner}}}{kind}{sep}{rest}"

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Map the slots and load the scripts (``warm``), then start retrying failed releases in
        ``tg``, which owns the task until it ends."""
        await warm(self._redis, (self._admit, self._release, self._refund), "counters")
        await tg.start(self.releases.run)

    async def admit(
        self,
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp] = (),
    ) -> Decision:
        if self.split:
            split = parts(budgets, slots, tallies)
            if len(split) > 1:
                return await self._admit_parts(split, budgets, slots, slot_id, now, tallies)
        kind, index, counts, _ = await self._admit_once(budgets, slots, slot_id, now, tallies)
        if kind == 0:
            return Decision(None, tuple(counts)) if counts else ADMITTED
        return Decision((_REFUSED[kind], index), tuple(counts))

    async def _admit_once(
        self,
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp],
    ) -> tuple[int, int, list[int], list[str]]:
        """One admit.lua: (kind, the refusing counter's index from 0, counts, raws)."""
        keys = [f"{self._key(b.key)}:{b.window}" for b in budgets] + [self._key(s.key) for s in slots]
        keys += [self._key(op.key, ":t") for op in tallies]
        args: list[Any] = [len(budgets), len(tallies), int(now * 1000), self._slot_ttl_ms, slot_id]
        for b in budgets:
            # Keep a window's counter a minute past its end, for late readers and clock skew.
            args += [b.limit, max(1, math.ceil((b.window_ends_at + 60 - now) * 1000))]
        args += [s.limit for s in slots]
        for op in tallies:
            if isinstance(op, Tally):
                args += ["t", op.amount, -1 if op.limit is None else op.limit]
            elif isinstance(op, Streak):
                args += ["s", 1 if op.hit else 0, 0]
            else:
                args += ["r", op.digest, 0]
            args.append(max(1, math.ceil(op.ttl_s * 1000)))
        try:
            self.round_trips += 1
            with anyio.fail_after(self._timeout_s):
                await ready(self._redis)
                kind, index, *rest = await self._admit(keys=keys, args=args)
        except REDIS_ERRORS as exc:  # (TimeoutError is an OSError)
            failed(self._redis, keys, exc)
            raise _unavailable(exc) from exc
        n = len(tallies)
        raws = [r.decode() if isinstance(r, bytes) else str(r) for r in rest[n:]]
        return int(kind), int(index) - 1, [int(c) for c in rest[:n]], raws

    async def _admit_parts(
        self,
        split: list[Part],
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp],
    ) -> Decision:
        """Each part in turn (see ``parts``); the first that refuses or fails gives back the
        parts taken before it, and is the admission's answer (its counts as they were; those of
        parts not reached, 0)."""
        tallied = [0] * len(tallies)
        taken: list[tuple[Part, list[int], list[str]]] = []
        for part in split:
            pb = [budgets[i] for i in part.budgets]
            ps = [slots[i] for i in part.slots]
            pt = [tallies[i] for i in part.tallies]
            try:
                kind, index, counts, raws = await self._admit_once(pb, ps, slot_id, now, pt)
            except CountersUnavailable:
                await self._refund_all(taken, budgets, slots, slot_id, tallies)
                raise
            except BaseException:
                # Cancelled: the slots taken are given back by the retries; counts stay (high).
                self._retry([self._key(slots[i].key) for p, _, _ in taken for i in p.slots], slot_id, "cancelled")
                raise
            for i, count in zip(part.tallies, counts, strict=True):
                tallied[i] = count
            if kind != 0:
                await self._refund_all(taken, budgets, slots, slot_id, tallies)
                for p, before, raws_taken in taken:  # the counts as they were: nothing is taken
                    for i, count, raw in zip(p.tallies, before, raws_taken, strict=True):
                        tallied[i] = count_before(tallies[i], count, raw)
                which = {1: part.budgets, 2: part.slots, 3: part.tallies}[kind][index]
                return Decision((_REFUSED[kind], which), tuple(tallied))
            taken.append((part, counts, raws))
        return Decision(None, tuple(tallied))

    async def _refund_all(
        self,
        taken: list[tuple[Part, list[int], list[str]]],
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        tallies: Sequence[TallyOp],
    ) -> None:
        """Give back the parts taken (refund.lua). A refund that fails leaves its counts high
        (never low: it is not repeated) and its slots to the retries."""
        for part, counts, raws in taken:
            pt = [tallies[i] for i in part.tallies]
            slot_keys = [self._key(slots[i].key) for i in part.slots]
            keys = [f"{self._key(budgets[i].key)}:{budgets[i].window}" for i in part.budgets] + slot_keys
            keys += [self._key(op.key, ":t") for op in pt]
            args: list[Any] = [len(part.budgets), len(pt), slot_id, *refund_args(pt, counts, raws)]
            try:
                self.round_trips += 1
                with anyio.fail_after(self._timeout_s):
                    await ready(self._redis)
                    await self._refund(keys=keys, args=args)
            except REDIS_ERRORS as exc:
                failed(self._redis, keys, exc)
                log.warning("could not give back the counts of a refused admission (%s)", exc)
                if slot_keys:
                    self._retry(slot_keys, slot_id, str(exc) or type(exc).__name__)

    async def tally(self, ops: Sequence[TallyOp], now: float) -> Tallies:
        """``admit`` with tally ops only: the same script, one round trip. Never retried, like an
        admission: a repeat whose first reply was lost would count the call twice."""
        if not ops:
            return Tallies(())
        decision = await self.admit((), (), "", now, ops)
        return Tallies(decision.tallied, None if decision.refused is None else decision.refused[1])

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        """Give the slots back. A failed attempt is left to the retries, when they run;
        otherwise it raises ``CountersUnavailable``."""
        if not slots:
            return
        keys = [self._key(s.key) for s in slots]
        try:
            error = await self._release_once(keys, slot_id)
        except BaseException:
            # Cancelled (the caller's deadline, a shutdown): the retries finish the release.
            self._retry(keys, slot_id, "cancelled")
            raise
        if error is not None and not self._retry(keys, slot_id, error):
            raise CountersUnavailable(error)

    async def _release_once(self, keys: list[str], slot_id: str) -> str | None:
        """None once released, else what went wrong."""
        try:
            self.round_trips += 1
            with anyio.fail_after(self._timeout_s):
                await ready(self._redis)
                await self._release(keys=keys, args=[slot_id])
        except REDIS_ERRORS as exc:
            failed(self._redis, keys, exc)
            return str(exc) or type(exc).__name__
        return None

    def _retry(self, keys: list[str], slot_id: str, error: str) -> bool:
        if not keys:
            return True

        async def attempt() -> bool:
            return await self._release_once(keys, slot_id) is None

        # Past slot_ttl_s the slot has expired: nothing is left to release.
        queued = self.releases.add(slot_id, attempt, self._slot_ttl_s)
        if queued:
            log.warning("the release of slot %s failed (%s); retrying", slot_id, error)
        return queued

    async def ping(self) -> None:
        try:
            with anyio.fail_after(self._timeout_s):
                await ready(self._redis)
                await self._redis.ping()
        except REDIS_ERRORS as exc:
            raise _unavailable(exc) from exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
