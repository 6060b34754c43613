"""Tripwires on model calls (issues 13 and 14): token and money budgets per run, the admission
kinds on ``model:NAME``, and the call log of model calls, against a real gateway in front of the
scripted provider (``model_provider``: its n-th request reports usage n times its unit: chat
completions 11 input and 3 output tokens, the Responses API 13 and 5) and the official client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
import tomli_w
from openai.types.chat import ChatCompletionMessageParam

from cli_process import run_haltwire_async
from haltwire.config import ConfigError
from haltwire.gateway.config import parse_config
from haltwire.gateway.usage import Usage
from haltwire.tripwires.backtest import replay, report
from haltwire.tripwires.rules import TripwireRule
from harness import config_dict
from models_harness import LEASES, OPS, Stack, lease_token, model_stack, models_section
from redis_process import shared_prefix
from tripwires_harness import stops_of

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
#: Per request n of the provider: (input, output) tokens, per endpoint.
UNIT = {CHAT: (11, 3), RESPONSES: (13, 5)}
REDIS = pytest.param("redis", marks=pytest.mark.redis)


def tokens_rule(limit: int, **fields: Any) -> dict[str, Any]:
    return {"name": "run-tokens", "kind": "tokens", "limit": limit, **fields}


@contextlib.contextmanager
def counters(backend: str) -> Iterator[dict[str, Any]]:
    if backend == "memory":
        yield {"backend": "memory"}
        return
    with shared_prefix("hwmodeltw") as (url, prefix):
        yield {"backend": "redis", "url": url, "prefix": prefix, "timeout_s": 5.0}


@contextlib.asynccontextmanager
async def tripwired(
    tmp_path: Path, rules: list[dict[str, Any]], backend: str = "memory", **sections: Any
) -> AsyncIterator[Stack]:
    """A gateway with leases and ``rules`` (no control plane: a trip latches for its life)."""
    with counters(backend) as c:
        async with model_stack(tmp_path, leases=LEASES, tripwires=rules, counters=c, **sections) as s:
            yield s


#: The error body of the last refusal ``call`` met.
REFUSED: dict[str, Any] = {}


async def call(s: Stack, path: str, stream: bool, run: str = "run-1", model: str = "gpt-test") -> str | None:
    """One model call in ``run``: its refusal code (its body in ``REFUSED``), "error" for the
    provider's error, else None."""
    client = s.client(max_retries=0, default_headers={"Haltwire-Lease": lease_token(run)})
    try:
        if path == CHAT:
            answer: Any = await client.chat.completions.create(model=model, messages=MESSAGES, stream=stream)
        else:
            answer = await client.responses.create(model=model, input="hi", stream=stream)
        if stream:
            async for _ in answer:
                pass
    except openai.APIStatusError as exc:
        body = exc.body
        if isinstance(body, dict) and body.get("type") == "haltwire_refusal":
            assert exc.status_code == (404 if body["code"] == "unknown_model" else 403)
            assert exc.response.headers["x-should-retry"] == "false"
            REFUSED.clear()
            REFUSED.update(body)
            return str(body["code"])
        return "error"
    return None


@pytest.mark.parametrize("backend", ["memory", REDIS])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", [CHAT, RESPONSES])
async def test_a_token_budget_trips_at_the_call_that_reaches_it_and_refuses_the_next(
    tmp_path: Path, path: str, stream: bool, backend: str
) -> None:
    i, o = UNIT[path]
    # Calls n = 1, 2, 3 use n units: the run's total is one unit after the first, three after the
    # second. A limit of two units and a token: the second call crosses it.
    limit = 2 * (i + o) + 1
    async with tripwired(tmp_path, [tokens_rule(limit)], backend) as s:
        assert await call(s, path, stream) is None
        assert s.app.gateway.tripwires is not None and not s.app.gateway.tripwires.trips
        assert await call(s, path, stream) is None  # served: its tokens are known only after it
        [trip] = s.app.gateway.tripwires.trips
        assert (trip.rule, trip.kind, trip.scope) == ("run-tokens", "tokens", "run:run-1")
        assert trip.figures["counted"] == i + o and trip.figures["this_call"] == 2 * (i + o)
        assert trip.figures["limit"] == limit and trip.figures["tool"] == "model:gpt-test"
        assert await call(s, path, stream) == "tripwire_tripped"
        assert (REFUSED["tripwire"], REFUSED["scope"], REFUSED["retryable"]) == (
            "run-tokens",
            "run:run-1",
            False,
        )
        assert len(s.provider.seen) == 2  # the refused call never reached the provider
        assert await call(s, path, stream, run="run-2") is None  # another run: its own budget
        assert s.app.models is not None
        assert (await s.app.models.usage.read(OPS, "run-1"))["run"] == Usage(3 * i, 3 * o)


@pytest.mark.parametrize("backend", ["memory", REDIS])
async def test_a_run_at_its_token_limit_is_refused_at_admission_on_every_gateway(
    tmp_path: Path, backend: str
) -> None:
    # Output tokens only: 3, then 6 (9 in all, the limit): the second call reaches it exactly.
    rules = [tokens_rule(9, count="output")]
    with counters(backend) as c:
        async with model_stack(tmp_path, leases=LEASES, tripwires=rules, counters=c) as s:
            assert await call(s, CHAT, False) is None
            assert await call(s, CHAT, False) is None
            assert s.app.gateway.tripwires is not None and len(s.app.gateway.tripwires.trips) == 1
            assert await call(s, CHAT, False) == "tripwire_tripped"
        if backend == "memory":
            return
        # A second gateway on the same Redis, which never saw the trip: its admission reads the count.
        async with model_stack(tmp_path, leases=LEASES, tripwires=rules, counters=c) as other:
            assert await call(other, CHAT, False) == "tripwire_tripped"
            assert not other.provider.seen
            assert other.app.gateway.tripwires is not None
            [trip] = other.app.gateway.tripwires.trips
            assert (trip.figures["counted"], trip.figures["limit"]) == (9, 9)


async def test_in_shadow_mode_nothing_is_refused_and_the_firing_is_recorded_once(tmp_path: Path) -> None:
    async with tripwired(tmp_path, [tokens_rule(20, mode="shadow")]) as s:
        for _ in range(4):
            assert await call(s, RESPONSES, True) is None
        tripwires = s.app.gateway.tripwires
        assert tripwires is not None and not tripwires.trips
        [fired] = tripwires.fired  # at the second call (18 + 36 = 54 tokens), and only there
        assert (fired.rule, fired.mode, fired.figures["counted"], fired.figures["this_call"]) == (
            "run-tokens",
            "shadow",
            18,
            36,
        )
        assert tripwires.shadow_firings == 1


async def test_a_money_budget_counts_the_price_table(tmp_path: Path) -> None:
    # gpt-test: 1 per million input tokens, 4 per million output: chat call n costs 23n micros.
    prices = {"*": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}}
    rule = {"name": "run-money", "kind": "model_cost", "limit": 50}
    async with tripwired(tmp_path, [rule], prices=prices) as s:
        assert await call(s, CHAT, False) is None  # 23
        assert await call(s, CHAT, False) is None  # 69: past 50, trips
        assert s.app.gateway.tripwires is not None
        [trip] = s.app.gateway.tripwires.trips
        assert (trip.kind, trip.figures["counted"], trip.figures["this_call"]) == ("model_cost", 23, 46)
        assert await call(s, CHAT, False) == "tripwire_tripped"


async def test_steps_and_policy_hits_take_model_calls_named_in_tools(tmp_path: Path) -> None:
    rules = [
        {"name": "model-steps", "kind": "steps", "limit": 2, "tools": ["model:gpt-test"]},
        # No tools: tool calls only, so model calls never reach its limit of 1.
        {"name": "tool-steps", "kind": "steps", "limit": 1},
        {"name": "model-errors", "kind": "policy_hits", "in_a_row": 2, "tools": ["model:*"]},
    ]
    async with tripwired(tmp_path, rules) as s:
        assert await call(s, CHAT, False) is None
        assert await call(s, RESPONSES, False) is None
        assert await call(s, CHAT, False) == "tripwire_tripped"  # the third step of gpt-test
        assert len(s.provider.seen) == 2
        # Provider errors in a row (scripted-fail answers 400), counted as model:scripted-*.
        assert await call(s, CHAT, False, run="run-2", model="scripted-fail") == "error"
        assert await call(s, CHAT, False, run="run-2", model="scripted-fail") == "error"
        assert await call(s, CHAT, False, run="run-2", model="scripted-ok") == "tripwire_tripped"
        tripwires = s.app.gateway.tripwires
        assert tripwires is not None
        assert [(t.rule, t.scope) for t in tripwires.trips] == [
            ("model-steps", "run:run-1"),
            ("model-errors", "run:run-2"),
        ]


async def test_a_tripped_token_budget_stops_its_run_through_the_control_plane(tmp_path: Path) -> None:
    stops = {"token": "tok-tripwire"}
    async with tripwired(tmp_path, [tokens_rule(20)], control=True, tripwire_stops=stops) as s:
        assert await call(s, CHAT, True) is None
        assert await call(s, CHAT, True) is None  # 14 + 28: trips
        assert s.control is not None
        with anyio.fail_after(10):
            while not (written := [x for x in await stops_of(s.control) if x["scope"] == "run:run-1"]):
                await anyio.sleep(0.05)
        assert "run-tokens" in written[0]["reason"]
        with anyio.fail_after(10):  # the latch until the stop arrives, then the stop itself
            while await call(s, CHAT, False) != "stopped":
                await anyio.sleep(0.05)
        assert await call(s, CHAT, False, run="run-2") is None


async def test_a_cut_stream_counts_what_was_relayed(tmp_path: Path) -> None:
    async with tripwired(tmp_path, [tokens_rule(1000)]) as s:
        client = s.client(default_headers={"Haltwire-Lease": lease_token("run-1")})
        stream = await client.chat.completions.create(model="scripted-hang", messages=MESSAGES, stream=True)
        events = aiter(stream)
        await anext(events)  # one delta relayed, then the provider hangs
        await stream.close()
        assert s.app.models is not None
        with anyio.fail_after(5):
            while (counted := (await s.app.models.usage.read(OPS, "run-1"))["run"]).output == 0:
                await anyio.sleep(0.02)
        body = json.dumps(s.provider.on(CHAT)[-1].body, separators=(",", ":"))
        assert counted.output == 1 and 0 < counted.input <= len(body)


async def test_the_call_log_holds_model_calls_and_a_replay_fires_as_live(tmp_path: Path) -> None:
    log_path = tmp_path / "calls.jsonl"
    rules = [
        tokens_rule(40),
        {"name": "model-steps", "kind": "steps", "limit": 5, "tools": ["model:*"], "mode": "shadow"},
    ]
    call_log = {"path": str(log_path), "flush_s": 0.05}
    async with tripwired(tmp_path, rules, call_log=call_log) as s:
        for _ in range(3):
            await call(s, CHAT, True)
        assert await call(s, CHAT, False, run="run-2", model="not-routed") == "unknown_model"
    records = [json.loads(line) for line in log_path.read_text().splitlines()]

    assert [(r["tool"], r["stage"], r["outcome"]) for r in records] == [
        ("model:gpt-test", "admitted", "ok"),
        ("model:gpt-test", "admitted", "ok"),
        ("model:gpt-test", "latch", "tripwire_tripped"),
        ("model:not-routed", "latch", "unknown_model"),
    ]
    assert [r.get("usage") for r in records[:2]] == [
        {"input": 11, "output": 3, "money_micros": 0},
        {"input": 22, "output": 6, "money_micros": 0},
    ]
    assert records[1]["tripwires"] == [{"rule": "run-tokens", "mode": "enforce", "scope": "run:run-1"}]
    assert [r["run"] for r in records] == ["run-1"] * 3 + ["run-2"]
    replayed = report(await replay([TripwireRule.model_validate(r) for r in rules], [str(log_path)]))
    assert replayed["same"] and [(f["index"], f["rule"]) for f in replayed["firings"]] == [(1, "run-tokens")]
    # The command, on a gateway config with the same [[models]] and rules.
    config = tmp_path / "gateway.toml"
    data = config_dict("http://127.0.0.1:1", models=models_section("http://127.0.0.1:2"), tripwires=rules)
    config.write_text(tomli_w.dumps(data))
    argv = ["tripwires", "test", "--config", str(config), "--log", str(log_path), "--json", "--expect-same"]
    done = await run_haltwire_async(*argv)
    assert done.returncode == 0, done.stderr
    assert [(f["index"], f["rule"], f["in_log"]) for f in json.loads(done.stdout)["firings"]] == [
        (1, "run-tokens", True)
    ]
    # A lower limit in the replay fires at the first call instead: the replay is not the log read back.
    lower = report(await replay([TripwireRule.model_validate(tokens_rule(10))], [str(log_path)]))
    assert not lower["same"] and next((f["index"], f["rule"]) for f in lower["firings"]) == (0, "run-tokens")


def config_error(rules: list[dict[str, Any]], prices: dict[str, Any] | None = None) -> str:
    data = config_dict(
        "http://127.0.0.1:1", models=models_section("http://127.0.0.1:2", prices), tripwires=rules
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return str(caught.value)


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"kind": "tokens"}, "needs limit"),
        ({"kind": "tokens", "limit": 0}, "limit >= 1"),
        ({"kind": "tokens", "limit": 5, "count": "cached"}, "count"),
        (
            {"kind": "steps", "limit": 5, "count": "input"},
            "count (input, output or total) is for tokens rules",
        ),
        ({"kind": "tokens", "limit": 5, "tools": ["lookup_order"]}, "model:NAME"),
        ({"kind": "repeated_calls", "in_a_row": 3, "tools": ["model:gpt-test"]}, "reads tool calls only"),
        ({"kind": "steps", "limit": 3, "tools": ["model:gpt-test"], "label": "bounded"}, "no label"),
        ({"kind": "steps", "limit": 3, "tools": ["model:scripted-x"]}, "model:PREFIX*"),
        ({"kind": "model_cost", "limit": 100}, "give [[models]] prices"),
    ],
)
def test_rules_on_model_calls_are_checked_with_clear_errors(rule: dict[str, Any], says: str) -> None:
    assert says in config_error([{"name": "r", **rule}])


def test_a_rule_on_model_calls_needs_models() -> None:
    data = config_dict("http://127.0.0.1:1", tripwires=[{"name": "r", "kind": "tokens", "limit": 5}])
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "no [[models]] routes any" in str(caught.value)
    # Priced: a money rule is accepted; a prefix's model calls are named model:PREFIX*.
    ok = [
        {"name": "m", "kind": "model_cost", "limit": 5},
        {"name": "s", "kind": "rate", "limit": 5, "window_s": 60, "tools": ["model:scripted-*"]},
    ]
    data = config_dict(
        "http://127.0.0.1:1",
        models=models_section("http://127.0.0.1:2", {"*": {"input_per_mtok": 1, "output_per_mtok": 1}}),
        tripwires=ok,
    )
    assert [r.name for r in parse_config(data).tripwires] == ["m", "s"]
