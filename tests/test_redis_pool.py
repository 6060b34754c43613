"""The Redis stores under load and through short outages: a pool that holds, writes that are retried.

Real Redis: the shared server under a unique key prefix, reached directly or through
``tcp_proxy.TcpProxy`` (whose ``block`` is a Redis that stops answering for a while). Time is
the ``now`` argument, as in ``test_counters.py``, except where a retry's own pace is the point.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlparse

import anyio
import pytest
import redis
import redis.asyncio as aioredis

from haltwire.config import ConfigError
from haltwire.gateway import counter_store, redis_pool_size, shared_redis
from haltwire.gateway.config import parse_config
from haltwire.store.counters import BudgetCounter, CountersUnavailable, SlotCounter
from haltwire.store.counters.redis import RedisCounters
from haltwire.store.idempotency import FRESH, IdempotencyUnavailable, Recorded
from haltwire.store.idempotency.redis import RedisIdempotency
from harness import config_dict
from redis_process import shared_prefix, unique_prefix
from tcp_proxy import TcpProxy

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

W = 20_000
NOW = W * 60 + 1.0
BUDGET = BudgetCounter("ops-bot:b", W, 100, (W + 1) * 60)
SLOTS = SlotCounter("ops-bot:f", 1000)


async def admit_all(store: RedisCounters, n: int) -> tuple[Counter[str], list[str]]:
    """``n`` admissions at once on a budget of 100: what each got, and the admitted slot ids."""
    seen: Counter[str] = Counter()
    admitted: list[str] = []

    async def one(i: int) -> None:
        try:
            decision = await store.admit([BUDGET], [SLOTS], f"call-{i}", NOW)
        except CountersUnavailable as exc:
            seen[f"unavailable: {exc}"] += 1
            return
        seen["admitted" if decision.admitted else "budget"] += 1
        if decision.admitted:
            admitted.append(f"call-{i}")

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return seen, admitted


def slots_held(url: str, prefix: str) -> int:
    raw = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return int(raw.zcard(f"{prefix}:{{ops-bot}}:f"))
    finally:
        raw.close()


# -- the pool -------------------------------------------------------------------------------


@pytest.mark.parametrize("max_connections", [None, 4], ids=["default-pool", "pool-of-4"])
async def test_300_admissions_at_once_are_all_answered_and_every_slot_comes_back(
    max_connections: int | None,
) -> None:
    """redis-py's default pool refused the 101st connection: 200 admissions were
    counters_unavailable while Redis was healthy. A smaller pool makes them wait their turn."""
    with shared_prefix("hwtest-pool") as (url, prefix):
        if max_connections is None:
            store = RedisCounters(url, prefix=prefix, timeout_s=5.0)
        else:
            store = RedisCounters(url, prefix=prefix, timeout_s=5.0, max_connections=max_connections)
        try:
            seen, admitted = await admit_all(store, 300)
            assert seen == {"admitted": 100, "budget": 200}
            async with anyio.create_task_group() as tg:
                for slot_id in admitted:
                    tg.start_soon(store.release, [SLOTS], slot_id)
            assert slots_held(url, prefix) == 0
        finally:
            await store.aclose()


async def test_admissions_waiting_for_a_connection_are_refused_within_the_timeout() -> None:
    """Waiting is part of the admission's deadline: Redis that never answers still fails closed in time."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)  # the kernel accepts; nothing ever answers
        store = RedisCounters(
            f"redis://127.0.0.1:{s.getsockname()[1]}/0",
            prefix=unique_prefix(),
            timeout_s=0.3,
            max_connections=1,
        )
        errors: list[BaseException] = []

        async def one() -> None:
            try:
                await store.admit([BUDGET], [], "", NOW)
            except CountersUnavailable as exc:
                errors.append(exc)

        started = time.monotonic()
        try:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for _ in range(5):
                        tg.start_soon(one)
        finally:
            await store.aclose()
        elapsed = time.monotonic() - started
        assert len(errors) == 5, "every admission is refused, none admitted uncounted"
        # One connection for five: one at a time, they would take 1.5 s.
        assert elapsed < 1.2, f"took {elapsed:.2f} s for a timeout of 0.3 s"


def test_the_pool_is_sized_from_the_listeners_connection_cap_unless_set() -> None:
    def pool_of(**counters: object) -> int:
        data = config_dict("http://127.0.0.1:9", counters={"backend": "redis", **counters})
        data["gateway"]["listener"] = {"max_connections": 300}
        config = parse_config(data)
        client = shared_redis(config)
        assert isinstance(client, aioredis.Redis)
        size: int = client.connection_pool.max_connections
        assert size == redis_pool_size(config)
        return size

    assert pool_of() == 300
    assert pool_of(max_connections=64) == 64
    with pytest.raises(ConfigError, match=r"counters\.max_connections"):
        pool_of(max_connections=0)
    assert shared_redis(parse_config(config_dict("http://127.0.0.1:9"))) is None
    assert not isinstance(counter_store(parse_config(config_dict("http://127.0.0.1:9"))), RedisCounters)


# -- releases that fail are retried ---------------------------------------------------------


@asynccontextmanager
async def through_proxy() -> AsyncIterator[tuple[TcpProxy, str, str, str]]:
    """A proxy to the shared Redis: (proxy, its Redis URL, the shared URL, a fresh key prefix)."""
    with shared_prefix("hwtest-retry") as (url, prefix):
        target = urlparse(url)
        async with TcpProxy.running(target.port or 6379, target.hostname or "127.0.0.1") as proxy:
            yield proxy, f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}", url, prefix


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` (in a thread: it may block on Redis) until it holds."""
    with anyio.fail_after(timeout_s):
        while not await anyio.to_thread.run_sync(condition):
            await anyio.sleep(0.05)


@pytest.mark.parametrize("how", ["timed-out", "cancelled"])
async def test_a_release_that_fails_is_retried_until_the_slot_is_free(how: str) -> None:
    """A release lost to a transient failure held its slot for slot_ttl_s (300 s here)."""
    one = SlotCounter("ops-bot:f", 1)
    async with through_proxy() as (proxy, via, url, prefix), anyio.create_task_group() as tg:
        timeout_s = 0.3 if how == "timed-out" else 5.0
        store = RedisCounters(via, prefix=prefix, slot_ttl_s=300.0, timeout_s=timeout_s)
        try:
            await store.start(tg)
            assert (await store.admit([], [one], "held", NOW)).admitted
            proxy.block()  # Redis stops answering
            if how == "timed-out":
                await store.release([one], "held")  # no error: the retries own it now
            else:
                with anyio.move_on_after(0.3, shield=True):  # as the gateway bounds its release
                    await store.release([one], "held")
            proxy.cut()  # the release never reached Redis
            assert store.releases.waiting == 1
            assert slots_held(url, prefix) == 1
            proxy.unblock()  # Redis is back
            await wait_until(lambda: slots_held(url, prefix) == 0)
            assert store.releases.done == 1 and store.releases.waiting == 0
            assert (await store.admit([], [one], "next", NOW)).admitted
        finally:
            tg.cancel_scope.cancel()
            await store.aclose()


async def test_a_release_is_given_up_once_its_slot_has_expired_anyway() -> None:
    one = SlotCounter("ops-bot:f", 1)
    async with through_proxy() as (proxy, via, _, prefix), anyio.create_task_group() as tg:
        store = RedisCounters(via, prefix=prefix, slot_ttl_s=1.0, timeout_s=0.2)
        try:
            await store.start(tg)
            assert (await store.admit([], [one], "held", NOW)).admitted
            proxy.block()  # and it stays down
            await store.release([one], "held")
            with anyio.fail_after(10):
                while store.releases.waiting:
                    await anyio.sleep(0.05)
            assert store.releases.given_up == 1 and store.releases.done == 0
        finally:
            tg.cancel_scope.cancel()
            await store.aclose()


async def test_without_its_retries_running_a_failed_release_raises() -> None:
    one = SlotCounter("ops-bot:f", 1)
    async with through_proxy() as (proxy, via, url, prefix):
        store = RedisCounters(via, prefix=prefix, timeout_s=0.2)
        try:
            assert (await store.admit([], [one], "held", NOW)).admitted
            proxy.block()
            with pytest.raises(CountersUnavailable):
                await store.release([one], "held")
            proxy.cut()
            proxy.unblock()
            await anyio.sleep(0.3)
            assert slots_held(url, prefix) == 1, "nothing retried it: it waits for slot_ttl_s"
        finally:
            await store.aclose()


# -- the idempotency records, on the same kind of pool --------------------------------------


async def test_300_idempotency_checks_at_once_are_all_answered() -> None:
    with shared_prefix("hwtest-pool") as (url, prefix):
        store = RedisIdempotency(url, prefix=prefix, timeout_s=5.0)
        seen: Counter[str] = Counter()

        async def one(i: int) -> None:
            try:
                seen[type(await store.begin(f"ops-bot:k{i}", "f", NOW, 60.0)).__name__] += 1
            except IdempotencyUnavailable as exc:
                seen[f"unavailable: {exc}"] += 1

        try:
            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(one, i)
        finally:
            await store.aclose()
        assert seen == {"Fresh": 300}


async def test_an_outcome_that_could_not_be_recorded_is_retried() -> None:
    """A lost ``complete`` left the key in flight for its whole ttl: every repeat outcome_unknown."""
    async with through_proxy() as (proxy, via, _, prefix), anyio.create_task_group() as tg:
        store = RedisIdempotency(via, prefix=prefix, timeout_s=0.3)
        try:
            await store.start(tg)
            assert await store.begin("ops-bot:k", "f", NOW, 3600.0) == FRESH
            proxy.block()
            await store.complete("ops-bot:k", '{"result": {}}')  # no error: retried
            proxy.cut()
            assert store.completions.waiting == 1
            proxy.unblock()
            with anyio.fail_after(10):
                while store.completions.waiting:
                    await anyio.sleep(0.05)
            assert await store.begin("ops-bot:k", "f", NOW, 3600.0) == Recorded('{"result": {}}')
        finally:
            tg.cancel_scope.cancel()
            await store.aclose()
