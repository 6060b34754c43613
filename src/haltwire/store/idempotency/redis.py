"""Idempotency records in Redis, shared by several gateways.

One record is a hash (``f``: fingerprint, ``o``: outcome once recorded) with a TTL set when
it is created, so a key is honoured by every gateway sharing the Redis server for as long as
Redis keeps it. ``begin`` is one Lua script (``begin.lua``): the check and the claim are
atomic across gateways, so two gateways cannot both get ``Fresh`` for one key.

Failure is loud, as for the counters: any error or timeout raises ``IdempotencyUnavailable``
and the call is refused, never made without the check. No retry: a retried ``begin`` whose
first reply was lost would find its own claim and answer ``InFlight``.
"""

from __future__ import annotations

import math

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from haltwire.store.counters.redis import _no_maintenance_notifications
from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Begun, IdempotencyUnavailable, Recorded
from haltwire.store.lua import lua_script

# The scripts are .lua files beside this module (their contracts are at their tops).
_BEGIN = lua_script(__package__, "begin.lua")
_COMPLETE = lua_script(__package__, "complete.lua")
_RELEASE = lua_script(__package__, "release.lua")


class RedisIdempotency:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "haltwire",
        timeout_s: float = 0.5,
        client: aioredis.Redis | None = None,
    ) -> None:
        self._prefix = prefix
        self._redis = client or aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            **_no_maintenance_notifications(),
        )
        self._begin = self._redis.register_script(_BEGIN)
        self._complete = self._redis.register_script(_COMPLETE)
        self._release = self._redis.register_script(_RELEASE)

    def _key(self, scope_key: str) -> str:
        # scope_key is AGENT:DIGEST (the digest has no colon); the agent is a hash tag, as in
        # the counters, so one identity's keys share a cluster slot.
        agent, _, digest = scope_key.rpartition(":")
        return f"{self._prefix}:{{{agent}}}:i:{digest}"

    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        try:
            reply = await self._begin(
                keys=[self._key(scope_key)], args=[fingerprint, max(1, math.ceil(ttl_s * 1000))]
            )
        except (RedisError, OSError) as exc:
            raise IdempotencyUnavailable(str(exc) or type(exc).__name__) from exc
        kind = int(reply[0])
        if kind == 0:
            return FRESH
        if kind == 1:
            outcome = reply[1]
            return Recorded(outcome.decode() if isinstance(outcome, bytes) else str(outcome))
        return IN_FLIGHT if kind == 2 else CONFLICT

    async def complete(self, scope_key: str, outcome: str) -> None:
        try:
            await self._complete(keys=[self._key(scope_key)], args=[outcome])
        except (RedisError, OSError) as exc:
            raise IdempotencyUnavailable(str(exc) or type(exc).__name__) from exc

    async def release(self, scope_key: str) -> None:
        try:
            await self._release(keys=[self._key(scope_key)], args=[])
        except (RedisError, OSError) as exc:
            raise IdempotencyUnavailable(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self._redis.aclose()
