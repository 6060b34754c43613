"""Counters in Redis, shared by several gateways.

Each admission decision is one Lua script (``admit.lua``), so one round trip and atomic
across every gateway: no two gateways can both take the last call of a budget. Slots are
members of a sorted set scored by their expiry, so a gateway that crashes while holding
slots cannot hold them forever: the next admission drops expired members.

Failure is loud: any error or timeout raises ``CountersUnavailable`` and the gateway
refuses the call. There is no retry (a retried admission whose first reply was lost
would count the call twice) and no fallback to counting in memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from haltwire.store.counters import ADMITTED, BudgetCounter, CountersUnavailable, Decision, SlotCounter
from haltwire.store.lua import lua_script

# The scripts are .lua files beside this module (their contracts are at their tops).
_ADMIT = lua_script(__package__, "admit.lua")
_RELEASE = lua_script(__package__, "release.lua")


def _no_maintenance_notifications() -> dict[str, Any]:
    """Client options that turn redis-py's maintenance notifications off, where it has them.

    Recent redis-py turns them on ("auto") over RESP3. With them on, the pool skips its check
    for stale connections before handing one out, so after Redis restarts (or closes idle
    clients) every pooled connection fails one admission; and during maintenance the socket
    timeout is relaxed to 10 s, far past the admission timeout. Checking a connection before
    use is safe (no command was sent on it), unlike retrying a command.
    """
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # an older redis-py: nothing to turn off
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


class RedisCounters:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "haltwire",
        slot_ttl_s: float = 300.0,
        timeout_s: float = 0.5,
        client: aioredis.Redis | None = None,
    ) -> None:
        self._prefix = prefix
        self._slot_ttl_ms = max(1, round(slot_ttl_s * 1000))
        self._redis = client or aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            **_no_maintenance_notifications(),
        )
        self._admit = self._redis.register_script(_ADMIT)
        self._release = self._redis.register_script(_RELEASE)
        #: Round trips made, for the benchmark's "round trips per call" figure.
        self.round_trips = 0

    def _key(self, key: str) -> str:
        # The identity part of every key is a hash tag, so one identity's counters share a
        # cluster slot and a multi-key script stays legal on Redis Cluster.
        agent, sep, rest = key.partition(":")
        return f"{self._prefix}:{{{agent}}}{sep}{rest}"

    async def admit(
        self, budgets: Sequence[BudgetCounter], slots: Sequence[SlotCounter], slot_id: str, now: float
    ) -> Decision:
        keys = [f"{self._key(b.key)}:{b.window}" for b in budgets] + [self._key(s.key) for s in slots]
        args: list[Any] = [len(budgets), int(now * 1000), self._slot_ttl_ms, slot_id]
        for b in budgets:
            # Keep a window's counter a minute past its end, for late readers and clock skew.
            args += [b.limit, max(1, math.ceil((b.window_ends_at + 60 - now) * 1000))]
        args += [s.limit for s in slots]
        try:
            self.round_trips += 1
            kind, index = await self._admit(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise CountersUnavailable(str(exc) or type(exc).__name__) from exc
        if kind == 0:
            return ADMITTED
        return Decision(("budget" if kind == 1 else "slots", int(index) - 1))

    async def release(self, slots: Sequence[SlotCounter], slot_id: str) -> None:
        if not slots:
            return
        try:
            self.round_trips += 1
            await self._release(keys=[self._key(s.key) for s in slots], args=[slot_id])
        except (RedisError, OSError) as exc:
            # The slot expires by itself after slot_ttl_s; nothing more to do here.
            raise CountersUnavailable(str(exc) or type(exc).__name__) from exc

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as exc:
            raise CountersUnavailable(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self._redis.aclose()
