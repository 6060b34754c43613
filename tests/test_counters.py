"""The ``CounterStore`` contract, for the in-memory store and for Redis (a real server).

Every contract test runs against both stores. Time is the ``now`` argument (a clock far
from the Redis server's wall clock, on purpose), never a sleep, except where Redis's own
key expiry is the point. Redis tests use a unique key prefix on the shared server and
delete their keys afterwards; tests that take Redis down start their own ``redis-server``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import redis

from haltwire.gateway.ceilings import Ceilings, Ticket
from haltwire.gateway.config import parse_config
from haltwire.gateway.proxy import released
from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.store.counters import BudgetCounter, CounterStore, CountersUnavailable, Decision, SlotCounter
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.counters.redis import RedisCounters
from harness import config_dict
from redis_process import private_redis, script_commands_since_reset, shared_prefix, unique_prefix

pytestmark = pytest.mark.anyio

WINDOW_S = 60
#: Window 20,000 of 60 s: 1970-01-14, far behind the Redis server's clock. The stores must
#: count in the caller's time, whatever the server's clock says.
W = 20_000
NOW = W * WINDOW_S + 1.0


def budget(key: str, limit: int, window: int = W) -> BudgetCounter:
    return BudgetCounter(key, window, limit, (window + 1) * WINDOW_S)


def at(window: int) -> float:
    """A time inside ``window``."""
    return window * WINDOW_S + 1.0


REFUSED_BUDGET_0 = Decision(("budget", 0))


# -- stores ---------------------------------------------------------------------------------


class Stores:
    """Opens stores of one kind. Redis stores opened by one ``Stores`` share a key prefix,
    so two of them stand for two gateways sharing one Redis."""

    def __init__(self, kind: str, url: str = "", prefix: str = "") -> None:
        self.kind = kind
        self.url = url
        self.prefix = prefix
        self._memory = MemoryCounters()

    @asynccontextmanager
    async def open(self, *, slot_ttl_s: float = 300.0) -> AsyncIterator[CounterStore]:
        if self.kind == "memory":
            yield self._memory
            return
        # The deadline covers connecting too; 200 admissions at once open 200 connections, slow
        # on a busy two-core machine. The timeout tests make stores of their own.
        store = RedisCounters(self.url, prefix=self.prefix, slot_ttl_s=slot_ttl_s, timeout_s=5.0)
        try:
            yield store
        finally:
            await store.aclose()


@pytest.fixture(params=["memory", "redis"])
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    if request.param == "memory":
        yield Stores("memory")
        return
    with shared_prefix("hwtest-counters") as (url, prefix):
        yield Stores("redis", url, prefix)


@pytest.fixture
def redis_stores() -> Iterator[Stores]:
    with shared_prefix("hwtest-counters") as (url, prefix):
        yield Stores("redis", url, prefix)


async def count_admitted(
    store: CounterStore,
    budgets: list[BudgetCounter],
    slots: list[SlotCounter],
    attempts: int,
    now: float = NOW,
    id_prefix: str = "id",
) -> int:
    admitted = 0
    for i in range(attempts):
        if (await store.admit(budgets, slots, f"{id_prefix}-{i}", now)).admitted:
            admitted += 1
    return admitted


# -- budgets --------------------------------------------------------------------------------


async def test_a_budget_admits_exactly_its_limit_per_window_and_refuses_the_next(stores: Stores) -> None:
    async with stores.open() as store:
        b = budget("ops-bot:b", 5)
        for _ in range(5):
            assert await store.admit([b], [], "", NOW) == Decision()
        for _ in range(3):
            assert await store.admit([b], [], "", NOW) == REFUSED_BUDGET_0
        # Later in the same window: still refused.
        assert await store.admit([b], [], "", NOW + WINDOW_S - 2) == REFUSED_BUDGET_0
        # Another key is another budget.
        assert (await store.admit([budget("billing-bot:b", 5)], [], "", NOW)).admitted


async def test_a_budget_of_zero_admits_nothing(stores: Stores) -> None:
    async with stores.open() as store:
        assert await store.admit([budget("ops-bot:b", 0)], [], "", NOW) == REFUSED_BUDGET_0


@pytest.mark.parametrize("now", [NOW, time.time(), 4_000_000_000.0], ids=["1970", "today", "2096"])
async def test_a_budget_holds_whatever_the_callers_clock_says(stores: Stores, now: float) -> None:
    window = int(now // WINDOW_S)
    async with stores.open() as store:
        b = BudgetCounter("ops-bot:b", window, 3, (window + 1) * WINDOW_S)
        assert await count_admitted(store, [b], [], 6, now=now) == 3


async def test_a_new_window_number_starts_fresh(stores: Stores) -> None:
    async with stores.open() as store:
        assert await count_admitted(store, [budget("ops-bot:b", 3, W)], [], 5, at(W)) == 3
        assert await count_admitted(store, [budget("ops-bot:b", 3, W + 1)], [], 5, at(W + 1)) == 3
        assert await count_admitted(store, [budget("ops-bot:b", 3, W + 5)], [], 5, at(W + 5)) == 3


async def test_a_late_call_from_the_previous_window_never_resets_the_current_one(stores: Stores) -> None:
    async with stores.open() as store:
        assert (await store.admit([budget("ops-bot:b", 3, W)], [], "", at(W))).admitted
        assert await count_admitted(store, [budget("ops-bot:b", 3, W + 1)], [], 3, at(W + 1)) == 3
        # A call stamped with the previous window (a clock stepped back) counts there...
        assert (await store.admit([budget("ops-bot:b", 3, W)], [], "", at(W))).admitted
        # ...and the current window stays exhausted.
        assert await store.admit([budget("ops-bot:b", 3, W + 1)], [], "", at(W + 1)) == REFUSED_BUDGET_0
        # The previous window keeps its own count: 2 used, 1 left.
        assert await count_admitted(store, [budget("ops-bot:b", 3, W)], [], 3, at(W)) == 1


# -- slots ----------------------------------------------------------------------------------


async def test_slots_are_taken_and_released(stores: Stores) -> None:
    async with stores.open() as store:
        s = SlotCounter("ops-bot:f", 2)
        assert (await store.admit([], [s], "a", NOW)).admitted
        assert (await store.admit([], [s], "b", NOW)).admitted
        assert await store.admit([], [s], "c", NOW) == Decision(("slots", 0))
        await store.release([s], "a")
        assert (await store.admit([], [s], "c", NOW)).admitted
        assert await store.admit([], [s], "d", NOW) == Decision(("slots", 0))
        await store.release([s], "b")
        await store.release([s], "c")
        assert (await store.admit([], [s], "e", NOW)).admitted
        assert (await store.admit([], [s], "f", NOW)).admitted
        assert not (await store.admit([], [s], "g", NOW)).admitted


async def test_releasing_twice_or_an_unknown_id_frees_no_one_elses_slot(stores: Stores) -> None:
    async with stores.open() as store:
        s = SlotCounter("ops-bot:f", 2)
        assert (await store.admit([], [s], "a", NOW)).admitted
        assert (await store.admit([], [s], "b", NOW)).admitted
        await store.release([s], "a")
        await store.release([s], "a")  # a second release of the same call
        await store.release([s], "never-admitted")
        assert (await store.admit([], [s], "c", NOW)).admitted
        assert await store.admit([], [s], "d", NOW) == Decision(("slots", 0)), "b and c hold both slots"


async def test_a_cancelled_calls_release_still_frees_its_slot(stores: Stores) -> None:
    """The gateway releases in ``finally``, often because the call was cancelled (client gone,
    a stop). A store whose release waits is shielded (and Redis's hands a release cut short to
    its retries); one that says it never waits (``releases_at_once``) is not, so it must not."""
    async with stores.open() as store:
        s = SlotCounter("ops-bot:f", 1)
        assert (await store.admit([], [s], "a", NOW)).admitted
        with anyio.CancelScope() as scope:
            scope.cancel()
            await released(Ticket(store, (s,), "a", deadline_s=5.0), Identity("ops-bot"))
        assert (await store.admit([], [s], "b", NOW)).admitted, "the cancelled call's slot was given back"


async def test_release_of_no_slots_is_a_no_op(stores: Stores) -> None:
    async with stores.open() as store:
        await store.release([], "")
        await store.release([SlotCounter("nobody:f", 1)], "x")
        assert (await store.admit([], [SlotCounter("nobody:f", 1)], "y", NOW)).admitted


# -- all or nothing -------------------------------------------------------------------------

LIMIT = 3


def four_counters() -> tuple[list[BudgetCounter], list[SlotCounter]]:
    return (
        [budget("ops-bot:b", LIMIT), budget("ops-bot:b:lookup_order", LIMIT)],
        [SlotCounter("ops-bot:f", LIMIT), SlotCounter("ops-bot:f:lookup_order", LIMIT)],
    )


async def room_left(store: CounterStore, kind: str, index: int) -> int:
    """How many more admissions the one counter takes on its own (slots taken are released)."""
    budgets, slots = four_counters()
    if kind == "budget":
        return await count_admitted(store, [budgets[index]], [], LIMIT + 2, id_prefix="probe")
    ids = [f"probe-{i}" for i in range(LIMIT + 2)]
    taken = [i for i in ids if (await store.admit([], [slots[index]], i, NOW)).admitted]
    for i in taken:
        await store.release([slots[index]], i)
    return len(taken)


@pytest.mark.parametrize("full", [("budget", 0), ("budget", 1), ("slots", 0), ("slots", 1)])
async def test_several_counters_are_all_or_nothing_and_the_refusal_names_the_full_one(
    stores: Stores, full: tuple[str, int]
) -> None:
    budgets, slots = four_counters()
    kind, index = full
    async with stores.open() as store:
        # One admission through all four takes one of each.
        assert (await store.admit(budgets, slots, "first", NOW)).admitted
        # Fill the one counter on its own.
        if kind == "budget":
            assert await count_admitted(store, [budgets[index]], [], LIMIT - 1, id_prefix="fill") == LIMIT - 1
        else:
            assert await count_admitted(store, [], [slots[index]], LIMIT - 1, id_prefix="fill") == LIMIT - 1
        for i in range(5):
            assert await store.admit(budgets, slots, f"refused-{i}", NOW) == Decision(full)
        # The refusals took nothing from the other three counters: each still has LIMIT - 1.
        for other in [("budget", 0), ("budget", 1), ("slots", 0), ("slots", 1)]:
            if other != full:
                assert await room_left(store, *other) == LIMIT - 1, other
        assert await room_left(store, kind, index) == 0


async def test_a_budget_refusal_takes_no_slot(stores: Stores) -> None:
    async with stores.open() as store:
        s = SlotCounter("ops-bot:f", 1)
        for i in range(5):
            assert await store.admit([budget("ops-bot:b", 0)], [s], f"r{i}", NOW) == REFUSED_BUDGET_0
        assert (await store.admit([], [s], "ok", NOW)).admitted, "the slot is still free"


async def test_a_slot_refusal_counts_nothing_against_the_budget(stores: Stores) -> None:
    async with stores.open() as store:
        b, s = budget("ops-bot:b", 2), SlotCounter("ops-bot:f", 1)
        assert (await store.admit([b], [s], "held", NOW)).admitted
        for i in range(5):
            assert await store.admit([b], [s], f"r{i}", NOW) == Decision(("slots", 0))
        await store.release([s], "held")
        assert (await store.admit([b], [s], "second", NOW)).admitted, "one call of the budget was left"
        assert await store.admit([b], [], "", NOW) == REFUSED_BUDGET_0, "and now none"


async def test_the_first_full_counter_is_named_budgets_before_slots(stores: Stores) -> None:
    async with stores.open() as store:
        full_b, open_b = budget("ops-bot:b", 0), budget("ops-bot:b:t", 5)
        full_s, open_s = SlotCounter("ops-bot:f", 1), SlotCounter("ops-bot:f:t", 5)
        assert (await store.admit([], [full_s], "holder", NOW)).admitted
        assert await store.admit([open_b, full_b], [full_s], "x", NOW) == Decision(("budget", 1))
        assert await store.admit([open_b], [open_s, full_s], "x", NOW) == Decision(("slots", 1))
        assert await store.admit([open_b], [full_s, open_s], "x", NOW) == Decision(("slots", 0))


# -- concurrency ----------------------------------------------------------------------------


async def test_200_concurrent_admissions_on_a_budget_of_50_admit_exactly_50(stores: Stores) -> None:
    """Four stores sharing one Redis stand for four gateways; the memory store is one process."""
    b = budget("ops-bot:b", 50)
    results: list[bool] = []
    async with (
        stores.open() as s1,
        stores.open() as s2,
        stores.open() as s3,
        stores.open() as s4,
    ):
        gateways = [s1, s2, s3, s4]

        async def one(i: int) -> None:
            decision = await gateways[i % 4].admit([b], [], "", NOW)
            results.append(decision.admitted)

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        assert len(results) == 200
        assert results.count(True) == 50
        assert await s1.admit([b], [], "", NOW) == REFUSED_BUDGET_0


async def test_100_concurrent_admissions_on_7_slots_take_exactly_7(stores: Stores) -> None:
    s = SlotCounter("ops-bot:f", 7)
    admitted: list[str] = []
    async with stores.open() as a, stores.open() as b:
        gateways = [a, b]

        async def one(i: int) -> None:
            if (await gateways[i % 2].admit([], [s], f"call-{i}", NOW)).admitted:
                admitted.append(f"call-{i}")

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(one, i)
        assert len(admitted) == 7
        async with anyio.create_task_group() as tg:
            for slot_id in admitted:
                tg.start_soon(a.release, [s], slot_id)
        assert await count_admitted(a, [], [s], 10) == 7


# -- Redis only: slot expiry ----------------------------------------------------------------


async def test_a_crashed_gateways_slot_expires_after_slot_ttl(redis_stores: Stores) -> None:
    s = SlotCounter("ops-bot:f", 1)
    async with redis_stores.open(slot_ttl_s=5.0) as crashed:
        assert (await crashed.admit([], [s], "never-released", NOW)).admitted
    # That gateway is gone without releasing; another one shares the Redis.
    async with redis_stores.open(slot_ttl_s=5.0) as survivor:
        assert await survivor.admit([], [s], "early", NOW + 4.9) == Decision(("slots", 0))
        assert (await survivor.admit([], [s], "late", NOW + 5.0)).admitted
        assert await survivor.admit([], [s], "next", NOW + 5.1) == Decision(("slots", 0))


async def test_redis_expires_idle_slot_and_budget_keys_by_itself(redis_stores: Stores) -> None:
    raw = redis.Redis.from_url(redis_stores.url)
    try:
        async with redis_stores.open(slot_ttl_s=1.0) as store:
            now = time.time()
            window = int(now // WINDOW_S)
            b = BudgetCounter("ops-bot:b", window, 5, (window + 1) * WINDOW_S)
            assert (await store.admit([b], [SlotCounter("ops-bot:f", 1)], "crashed", now)).admitted
            slot_key = f"{redis_stores.prefix}:{{ops-bot}}:f"
            budget_key = f"{redis_stores.prefix}:{{ops-bot}}:b:{window}"
            slot_pttl = raw.pttl(slot_key)
            if time.time() - now < 0.9:  # (a starved test process may read it only after expiry)
                assert 0 < slot_pttl <= 1000
            # The window's counter outlives the window by a minute, counted from the caller's now.
            expected_ms = (b.window_ends_at + 60 - now) * 1000
            assert expected_ms - 2000 < raw.pttl(budget_key) <= expected_ms + 1
            # Nobody releases the slot: Redis drops the whole key once slot_ttl_s has passed.
            with anyio.fail_after(5):
                while raw.exists(slot_key):
                    await anyio.sleep(0.05)
            assert time.time() - now >= 0.99
            assert (await store.admit([], [SlotCounter("ops-bot:f", 1)], "new", time.time())).admitted
    finally:
        raw.close()


async def test_budget_keys_expire_relative_to_the_callers_clock(redis_stores: Stores) -> None:
    raw = redis.Redis.from_url(redis_stores.url)
    try:
        async with redis_stores.open() as store:
            assert (await store.admit([budget("ops-bot:b", 5)], [], "", NOW)).admitted
            ttl = raw.pttl(f"{redis_stores.prefix}:{{ops-bot}}:b:{W}")
            # NOW is 1 s into its window: 59 s left, plus the minute after.
            assert 110_000 < ttl <= 119_000
    finally:
        raw.close()


# -- Redis unreachable ----------------------------------------------------------------------


async def test_redis_on_a_closed_port_raises_counters_unavailable_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        store = RedisCounters(f"redis://127.0.0.1:{port}/0", prefix=unique_prefix(), timeout_s=2.0)
        try:
            started = time.monotonic()
            with pytest.raises(CountersUnavailable):
                await store.admit([budget("ops-bot:b", 5)], [], "", NOW)
            with pytest.raises(CountersUnavailable):
                await store.admit([], [SlotCounter("ops-bot:f", 1)], "x", NOW)
            with pytest.raises(CountersUnavailable):
                await store.release([SlotCounter("ops-bot:f", 1)], "x")
            assert time.monotonic() - started < 1.0, "a refused connection does not wait for the timeout"
        finally:
            await store.aclose()


async def test_redis_that_never_answers_raises_counters_unavailable_within_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)  # the kernel accepts the connection; nothing ever answers
        store = RedisCounters(
            f"redis://127.0.0.1:{s.getsockname()[1]}/0", prefix=unique_prefix(), timeout_s=0.2
        )
        try:
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(CountersUnavailable):
                    await store.admit([budget("ops-bot:b", 5)], [], "", NOW)
                elapsed = time.monotonic() - started
                assert 0.15 < elapsed < 0.2 + 1.0, f"took {elapsed:.3f} s; the timeout is 0.2 s"
        finally:
            await store.aclose()


# -- Ceilings over Redis that is down -------------------------------------------------------


def ceilings_config(url: str) -> dict[str, object]:
    return config_dict(
        "http://127.0.0.1:9",
        counters={"backend": "redis", "url": url},
        limits={"budget": 100, "max_in_flight": 5},
    )


def assert_counters_unavailable(result: Ticket | Refusal) -> None:
    assert isinstance(result, Refusal), f"expected a refusal, got {result!r}"
    assert result.code == "counters_unavailable"
    assert result.retryable is True
    assert result.retry_after_s is not None and result.retry_after_s > 0
    assert result.tool_result()["isError"] is True
    assert result.http_status == 503


async def test_ceilings_refuse_with_counters_unavailable_when_redis_cannot_be_reached() -> None:
    url = "redis://127.0.0.1:1/0"
    config = parse_config(ceilings_config(url))
    store = RedisCounters(url, prefix=unique_prefix(), timeout_s=0.3)
    try:
        ceilings = Ceilings(config, store)
        for _ in range(3):
            assert_counters_unavailable(await ceilings.admit(Identity("ops-bot"), "lookup_order"))
    finally:
        await store.aclose()


async def test_ceilings_fail_closed_while_redis_is_down_and_admit_again_when_it_is_back(
    tmp_path: Path,
) -> None:
    with private_redis(tmp_path) as server:
        config = parse_config(ceilings_config(server.url))
        store = RedisCounters(server.url, prefix=unique_prefix(), timeout_s=0.3)
        try:
            ceilings = Ceilings(config, store)
            ops = Identity("ops-bot")
            ticket = await ceilings.admit(ops, "lookup_order")
            assert isinstance(ticket, Ticket)
            await ticket.release()
            held = await ceilings.admit(ops, "lookup_order")  # in flight when Redis goes
            assert isinstance(held, Ticket)

            server.stop()
            for _ in range(5):
                assert_counters_unavailable(await ceilings.admit(ops, "lookup_order"))
            with pytest.raises(CountersUnavailable):
                await held.release()

            server.start()  # same port, empty (no persistence)
            again = await ceilings.admit(ops, "lookup_order")
            assert isinstance(again, Ticket), again
            await again.release()
        finally:
            await store.aclose()


async def test_a_store_whose_redis_restarted_while_idle_admits_on_the_next_call(tmp_path: Path) -> None:
    """Pooled connections to the old server are dropped, not used for the next admission."""
    with private_redis(tmp_path) as server:
        # A dead pooled connection fails at once, whatever the deadline; a new connection to the
        # restarted server once took past 0.3 s on a loaded CI machine.
        store = RedisCounters(server.url, prefix=unique_prefix(), timeout_s=2.0)
        try:
            b = budget("ops-bot:b", 5)
            assert (await store.admit([b], [], "", NOW)).admitted
            # Restart in a thread: the event loop keeps running, as a gateway's does.
            await anyio.to_thread.run_sync(server.restart)
            assert (await store.admit([b], [], "", NOW)).admitted
            # The restarted server has no persistence: the window starts again from 0.
            assert await count_admitted(store, [b], [], 10) == 4
        finally:
            await store.aclose()


async def test_a_started_stores_first_admission_is_one_script_already_loaded(tmp_path: Path) -> None:
    """``start`` gives the server the scripts: the first admission after a gateway (re)starts
    is one EVALSHA, not a NOSCRIPT and an EVAL within its deadline."""
    with private_redis(tmp_path) as server:
        raw = redis.Redis.from_url(server.url)
        store = RedisCounters(server.url, prefix=unique_prefix(), timeout_s=0.3)
        try:
            async with anyio.create_task_group() as tg:
                await store.start(tg)
                raw.config_resetstat()
                assert (await store.admit([budget("ops-bot:b", 5)], [SlotCounter("ops-bot:f", 2)], "s", NOW)).admitted
                await store.release([SlotCounter("ops-bot:f", 2)], "s")
                assert script_commands_since_reset(raw) == {"evalsha": 2}, "admit.lua and release.lua, each once"
                tg.cancel_scope.cancel()
        finally:
            await store.aclose()
            raw.close()


async def test_a_store_started_while_redis_is_down_starts_refuses_and_admits_once_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with private_redis(tmp_path) as server:
        server.stop()
        store = RedisCounters(server.url, prefix=unique_prefix(), timeout_s=0.3)
        b = budget("ops-bot:b", 5)
        try:
            async with anyio.create_task_group() as tg:
                started = time.monotonic()
                await store.start(tg)
                assert time.monotonic() - started < 2.0, "a refused connection does not hold the start"
                assert "could not give Redis their scripts at start" in caplog.text
                with pytest.raises(CountersUnavailable):
                    await store.admit([b], [], "", NOW)
                server.start()  # the same port
                assert (await store.admit([b], [], "", NOW)).admitted
                tg.cancel_scope.cancel()
        finally:
            await store.aclose()


async def test_a_redis_that_never_answers_holds_a_stores_start_no_longer_than_its_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)  # the kernel accepts the connection; nothing ever answers
        store = RedisCounters(f"redis://127.0.0.1:{s.getsockname()[1]}/0", prefix=unique_prefix(), timeout_s=0.2)
        try:
            async with anyio.create_task_group() as tg:
                started = time.monotonic()
                await store.start(tg)
                elapsed = time.monotonic() - started
                assert elapsed < 0.2 + 1.0, f"the start took {elapsed:.3f} s; the timeout is 0.2 s"
                assert "could not give Redis their scripts at start" in caplog.text
                tg.cancel_scope.cancel()
        finally:
            await store.aclose()


async def test_two_gateways_slot_ids_never_collide_in_a_shared_store(redis_stores: Stores) -> None:
    """Each Ceilings (one per gateway process) numbers its slots under its own random prefix;
    ids that collided would be one sorted-set member, and the cap would admit a third call."""
    config = parse_config(config_dict("http://127.0.0.1:9", limits={"max_in_flight": 2}))
    ops = Identity("ops-bot")
    async with redis_stores.open() as store_a, redis_stores.open() as store_b:
        gateway_a, gateway_b = Ceilings(config, store_a), Ceilings(config, store_b)
        first, second = await gateway_a.admit(ops, "lookup_order"), await gateway_b.admit(ops, "lookup_order")
        assert isinstance(first, Ticket) and isinstance(second, Ticket)
        assert first.slot_id != second.slot_id
        third = await gateway_a.admit(ops, "lookup_order")
        assert isinstance(third, Refusal) and third.code == "too_many_in_flight"
        await first.release()
        fourth = await gateway_b.admit(ops, "lookup_order")
        assert isinstance(fourth, Ticket)


async def test_memory_counters_forget_keys_whose_windows_are_long_over() -> None:
    from haltwire.store.counters import BudgetCounter
    from haltwire.store.counters.memory import MemoryCounters

    store = MemoryCounters()
    for run in range(5000):  # one key per run, as a per-run step budget makes
        budget = BudgetCounter(f"ops:r:run-{run}", window=0, limit=10, window_ends_at=100.0)
        assert (await store.admit([budget], [], "s", now=50.0)).admitted
    assert len(store) == 5000
    live = BudgetCounter("ops:r:live", window=0, limit=10_000, window_ends_at=10_000.0)
    for _ in range(4096):  # enough admissions to trigger a sweep, a minute after the runs' windows
        await store.admit([live], [], "s", now=161.0)
    assert len(store) == 1, "only the key whose window is still open is kept"
