"""The usage kinds of the tripwires (``tokens``, ``model_cost``) and model calls in the admission
kinds, in the engine itself (``Tripwires.plan``/``judge``/``spent``), on both counter stores:
memory, and a real Redis under a fresh key prefix. Same calls, same answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.store.counters import CounterStore
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.counters.redis import RedisCounters
from haltwire.tripwires.engine import Tripwires
from haltwire.tripwires.rules import TripwireRule
from haltwire.tripwires.usage import Spent
from redis_process import shared_prefix

pytestmark = pytest.mark.anyio

OPS = Identity("ops-bot", "acme", "1.0")
MODEL = "model:gpt-test"


@asynccontextmanager
async def store(backend: str) -> AsyncIterator[CounterStore]:
    if backend == "memory":
        yield MemoryCounters()
        return
    with shared_prefix("hwtest-usage") as (url, prefix):
        redis = RedisCounters(url, prefix=prefix, timeout_s=5.0)
        try:
            yield redis
        finally:
            await redis.aclose()


BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


def rules(*fields: dict[str, Any]) -> list[TripwireRule]:
    return [TripwireRule.model_validate({"name": f"r{n}", **f}) for n, f in enumerate(fields)]


async def admitted(engine: Tripwires, s: CounterStore, tool: str = MODEL, run: str = "run-1") -> str | None:
    """The refusal code of the call's admission (plan, the store's tally, judge), or None."""
    plan = engine.plan(OPS, tool, run, None)
    if plan is None:
        return None
    if isinstance(plan, Refusal):
        return plan.code
    refused = engine.judge(plan, await s.tally(plan.ops, plan.now))
    return None if refused is None else refused.code


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_token_budget_refuses_once_reached_and_trips_at_the_crossing(backend: str) -> None:
    async with store(backend) as s:
        engine = Tripwires(rules({"kind": "tokens", "limit": 100, "count": "output"}), s)
        assert await admitted(engine, s) is None
        await engine.spent(OPS, MODEL, "run-1", Spent(500, 60))  # input tokens do not count here
        assert not engine.trips
        assert await admitted(engine, s) is None  # 60 < 100
        await engine.spent(OPS, MODEL, "run-1", Spent(500, 40))  # 100: reaches the limit
        [trip] = engine.trips
        assert (trip.rule, trip.scope, trip.figures["counted"], trip.figures["this_call"]) == (
            "r0",
            "run:run-1",
            60,
            40,
        )
        # Another gateway on the same counters (never saw the trip) refuses at admission.
        other = Tripwires(rules({"kind": "tokens", "limit": 100, "count": "output"}), s)
        assert await admitted(other, s) == "tripwire_tripped"
        assert await admitted(other, s, run="run-2") is None
        # A call in flight when it crossed still adds its usage; the rule does not trip twice.
        await engine.spent(OPS, MODEL, "run-1", Spent(0, 30))
        assert len(engine.trips) == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_in_shadow_a_usage_rule_checks_nothing_at_admission_and_fires_once(backend: str) -> None:
    async with store(backend) as s:
        engine = Tripwires(rules({"kind": "model_cost", "limit": 1000, "mode": "shadow"}), s)
        assert engine.plan(OPS, MODEL, "run-1", None) is None  # no work at admission
        for _ in range(4):
            await engine.spent(OPS, MODEL, "run-1", Spent(10, 10, 400))
        [fired] = engine.fired
        assert (fired.mode, fired.figures["counted"], fired.figures["this_call"]) == ("shadow", 800, 400)
        assert not engine.trips and engine.shadow_firings == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_model_calls_count_in_rules_that_name_them_only(backend: str) -> None:
    async with store(backend) as s:
        engine = Tripwires(
            rules(
                {"kind": "steps", "limit": 1},  # no tools: tool calls only
                {"kind": "steps", "limit": 2, "tools": ["model:*"]},
                {"kind": "tokens", "limit": 10},  # every model call, never a tool call
            ),
            s,
        )
        assert await admitted(engine, s) is None
        assert await admitted(engine, s) is None
        assert await admitted(engine, s) == "tripwire_tripped"  # the third model call of r1
        assert [t.rule for t in engine.trips] == ["r1"]
        assert await admitted(engine, s, tool="lookup_order", run="run-2") is None
        assert await admitted(engine, s, tool="lookup_order", run="run-2") == "tripwire_tripped"  # r0
        await engine.spent(OPS, "lookup_order", "run-3", Spent(100, 100))  # not a model call: not counted
        assert await admitted(engine, s, run="run-3") is None
