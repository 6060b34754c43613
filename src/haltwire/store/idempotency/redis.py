"""Idempotency records in Redis, shared by several gateways.

One record is a hash (``f``: fingerprint, ``o``: outcome once recorded) with a TTL set when
it is created, so a key is honoured by every gateway sharing the Redis server for as long as
Redis keeps it. ``begin`` is one Lua script (``begin.lua``): the check and the claim are
atomic across gateways, so two gateways cannot both get ``Fresh`` for one key.

Failure is loud, as for the counters: any error, or no answer within ``timeout_s`` (waiting
for a pooled connection included), raises ``IdempotencyUnavailable`` and the call is refused,
never made without the check. ``begin`` is never retried: a retried ``begin`` whose first
reply was lost would find its own claim and answer ``InFlight``. Nor is ``release``: once its
lost reply had freed the key, another call may claim it, and a repeat would free that claim.
``complete`` is retried (setting the same outcome again is harmless; a lost one would leave the
key in flight, every repeat refused ``outcome_unknown``), in a task the gateway starts.

Each script touches one key, ``PREFIX:{TENANT/AGENT}:i:DIGEST``, so it is one round trip on
Redis Cluster too (the hash tag keeps one agent's records in one slot).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc

from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Begun, IdempotencyUnavailable, Recorded
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
_BEGIN = lua_script(__package__, "begin.lua")
_COMPLETE = lua_script(__package__, "complete.lua")
_RELEASE = lua_script(__package__, "release.lua")


class RedisIdempotency:
    def __init__(
        self,
        url: str | Sequence[str] = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "haltwire",
        timeout_s: float = 0.5,
        max_connections: int = MAX_CONNECTIONS,
        retry_for_s: float = 86400.0,
        cluster: bool = False,
        client: RedisClient | None = None,
    ) -> None:
        """``retry_for_s``: how long a failed ``complete`` is retried (the records' ``ttl_s``:
        past it the record is gone). ``client``: shared, closed by its owner, not here."""
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._retry_for_s = retry_for_s
        self._owns_client = client is None
        self._redis = client or redis_client(
            url, timeout_s=timeout_s, max_connections=max_connections, cluster=cluster
        )
        #: Outcomes that could not be recorded at once, retried.
        self.completions = Retries("outcome record")
        self._begin = Script(self._redis, _BEGIN)
        self._complete = Script(self._redis, _COMPLETE)
        self._release = Script(self._redis, _RELEASE)

    def _key(self, scope_key: str) -> str:
        # scope_key is AGENT:DIGEST (the digest has no colon); the agent is a hash tag, as in
        # the counters, so one identity's keys share a cluster slot.
        agent, _, digest = scope_key.rpartition(":")
        return f"{self._prefix}:{{{agent}}}:i:{digest}"

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Map the slots and load the scripts (``warm``), then start retrying failed ``complete``
        calls in ``tg``, which owns the task until it ends."""
        await warm(self._redis, (self._begin, self._complete, self._release), "idempotency records")
        await tg.start(self.completions.run)

    async def _run(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        try:
            with anyio.fail_after(self._timeout_s):
                await ready(self._redis)
                return await script(keys=keys, args=args)
        except REDIS_ERRORS as exc:  # (TimeoutError is an OSError)
            failed(self._redis, keys, exc)
            raise IdempotencyUnavailable(str(exc) or type(exc).__name__) from exc

    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        reply = await self._run(self._begin, [self._key(scope_key)], [fingerprint, ttl_ms])
        kind = int(reply[0])
        if kind == 0:
            return FRESH
        if kind == 1:
            outcome = reply[1]
            return Recorded(outcome.decode() if isinstance(outcome, bytes) else str(outcome))
        return IN_FLIGHT if kind == 2 else CONFLICT

    async def complete(self, scope_key: str, outcome: str) -> None:
        """Record the outcome; a failed attempt is left to the retries when they run."""
        keys = [self._key(scope_key)]

        async def attempt() -> bool:
            try:
                await self._run(self._complete, keys, [outcome])
            except IdempotencyUnavailable:
                return False
            return True

        try:
            await self._run(self._complete, keys, [outcome])
        except IdempotencyUnavailable as exc:
            if not self.completions.add(scope_key, attempt, self._retry_for_s):
                raise
            log.warning("recording the outcome of %s failed (%s); retrying", scope_key, exc)
        except BaseException:
            self.completions.add(scope_key, attempt, self._retry_for_s)  # cancelled: retried
            raise

    async def release(self, scope_key: str) -> None:
        await self._run(self._release, [self._key(scope_key)], [])

    async def aclose(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
