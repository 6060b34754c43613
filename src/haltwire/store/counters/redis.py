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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

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
from haltwire.store.lua import lua_script
from haltwire.store.redis import MAX_CONNECTIONS, redis_client
from haltwire.store.retry import Retries

log = logging.getLogger("haltwire.store")

# The scripts are .lua files beside this module (their contracts are at their tops).
_ADMIT = lua_script(__package__, "admit.lua")
_RELEASE = lua_script(__package__, "release.lua")
#: What refused, by the script's answer.
_REFUSED = {1: "budget", 2: "slots", 3: "tally"}


def _unavailable(exc: BaseException) -> CountersUnavailable:
    return CountersUnavailable(str(exc) or type(exc).__name__)


class RedisCounters:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "haltwire",
        slot_ttl_s: float = 300.0,
        timeout_s: float = 0.5,
        max_connections: int = MAX_CONNECTIONS,
        client: aioredis.Redis | None = None,
    ) -> None:
        """``client``: a client shared with other stores, closed by its owner, not here."""
        self._prefix = prefix
        self._slot_ttl_s = slot_ttl_s
        self._slot_ttl_ms = max(1, round(slot_ttl_s * 1000))
        self._timeout_s = timeout_s
        self._owns_client = client is None
        self._redis = client or redis_client(url, timeout_s=timeout_s, max_connections=max_connections)
        self._admit = self._redis.register_script(_ADMIT)
        self._release = self._redis.register_script(_RELEASE)
        #: Releases that failed, retried until done or until their slots have expired.
        self.releases = Retries("slot release")
        #: Round trips made, for the benchmark's "round trips per call" figure.
        self.round_trips = 0

    def _key(self, key: str) -> str:
        # The identity part of every key is a hash tag, so one identity's counters share a
        # cluster slot and a multi-key script stays legal on Redis Cluster.
        agent, sep, rest = key.partition(":")
        return f"{self._prefix}:{{{agent}}}{sep}{rest}"

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start retrying failed releases in ``tg``, which owns the task until it ends."""
        await tg.start(self.releases.run)

    async def admit(
        self,
        budgets: Sequence[BudgetCounter],
        slots: Sequence[SlotCounter],
        slot_id: str,
        now: float,
        tallies: Sequence[TallyOp] = (),
    ) -> Decision:
        keys = [f"{self._key(b.key)}:{b.window}" for b in budgets] + [self._key(s.key) for s in slots]
        keys += [f"{self._prefix}:t:{op.key}" for op in tallies]
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
                kind, index, *counts = await self._admit(keys=keys, args=args)
        except (RedisError, OSError) as exc:  # (TimeoutError is an OSError)
            raise _unavailable(exc) from exc
        tallied = tuple(int(c) for c in counts)
        if kind == 0:
            return Decision(None, tallied) if tallied else ADMITTED
        return Decision((_REFUSED[int(kind)], int(index) - 1), tallied)

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
                await self._release(keys=keys, args=[slot_id])
        except (RedisError, OSError) as exc:
            return str(exc) or type(exc).__name__
        return None

    def _retry(self, keys: list[str], slot_id: str, error: str) -> bool:
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
                await self._redis.ping()
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
