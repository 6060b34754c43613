"""Idempotency keys for bounded tools: a repeated key is answered from its record, once upstream.

Real servers on loopback: the demo upstream (its ``served`` counters are the upstream's own
record of what it did), the gateway in front of it with ``lookup_order`` (and ``sleep``,
``fail``) labelled ``bounded`` in the config, and the official MCP client. Redis tests use a
private ``redis-server`` and a unique key prefix.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from haltwire.config import ConfigError
from haltwire.gateway.config import parse_config
from haltwire.gateway.idempotency import derived_key
from haltwire.meta import KEY_META, LEASE_META, REPLAYED_META
from haltwire.store.counters.memory import MemoryCounters
from haltwire.store.idempotency import (
    CONFLICT,
    FRESH,
    IN_FLIGHT,
    IdempotencyStore,
    IdempotencyUnavailable,
    Recorded,
)
from haltwire.store.idempotency.memory import MemoryIdempotency
from haltwire.store.idempotency.sqlite import SqliteIdempotency
from haltwire.tokens import LeaseClaims, LeaseKeys
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from redis_process import private_redis, unique_prefix

pytestmark = pytest.mark.anyio

LEASE_SECRET = "idem-" + "c" * 40
BOUNDED = {"lookup_order": "bounded", "sleep": "bounded", "fail": "bounded"}


def bounded_config(up: str, **sections: Any) -> dict[str, Any]:
    data = config_dict(up, **sections)
    data["upstreams"][0]["labels"] = BOUNDED
    return data


def code_of(result: CallToolResult) -> str | None:
    sc = result.structured_content or {}
    error = sc.get("error") if isinstance(sc, dict) else None
    return error["code"] if isinstance(error, dict) else None


def meta_of(result: CallToolResult) -> dict[str, Any]:
    return dict(result.meta or {})


async def lookup(client: Client, order: str, key: str | None = None, **meta: Any) -> CallToolResult:
    m: dict[str, Any] = dict(meta)
    if key is not None:
        m[KEY_META] = key
    return await client.call_tool("lookup_order", {"order_id": order}, meta=m or None)  # type: ignore[arg-type]


# The memory store itself.


@pytest.fixture(params=["memory", "sqlite"])
async def one_gateway_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[IdempotencyStore]:
    """The stores of a single gateway: in memory, or in a SQLite file (outliving a restart)."""
    store: IdempotencyStore = (
        MemoryIdempotency() if request.param == "memory" else SqliteIdempotency(tmp_path / "idem.db")
    )
    yield store
    await store.aclose()


async def test_a_store_answers_each_state_and_honours_the_ttl_on_the_given_clock(
    one_gateway_store: IdempotencyStore,
) -> None:
    store = one_gateway_store
    assert await store.begin("a:k", "fp1", now=1000.0, ttl_s=100.0) == FRESH
    assert await store.begin("a:k", "fp1", now=1001.0, ttl_s=100.0) == IN_FLIGHT
    assert await store.begin("a:k", "fp2", now=1001.0, ttl_s=100.0) == CONFLICT
    await store.complete("a:k", '{"result":{}}')
    assert await store.begin("a:k", "fp1", now=1099.0, ttl_s=100.0) == Recorded('{"result":{}}')
    assert await store.begin("b:k", "fp1", now=1099.0, ttl_s=100.0) == FRESH  # another agent's scope
    # Expired: the key is free again, for any fingerprint.
    assert await store.begin("a:k", "fp2", now=1100.0, ttl_s=100.0) == FRESH
    await store.release("a:k")
    assert await store.begin("a:k", "fp3", now=1100.0, ttl_s=100.0) == FRESH


async def test_sqlite_records_outlive_the_gateway_that_wrote_them(tmp_path: Path) -> None:
    first = SqliteIdempotency(tmp_path / "idem.db")
    assert await first.begin("a:done", "fp", now=1000.0, ttl_s=100.0) == FRESH
    await first.complete("a:done", '{"result":{}}')
    assert await first.begin("a:open", "fp", now=1000.0, ttl_s=100.0) == FRESH  # then a crash
    await first.aclose()
    again = SqliteIdempotency(tmp_path / "idem.db")  # the restarted gateway
    assert await again.begin("a:done", "fp", now=1001.0, ttl_s=100.0) == Recorded('{"result":{}}')
    assert await again.begin("a:open", "fp", now=1001.0, ttl_s=100.0) == IN_FLIGHT  # outcome unknown
    await again.aclose()


async def test_an_unusable_sqlite_path_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    store = SqliteIdempotency(tmp_path / "missing-dir" / "idem.db")
    with pytest.raises(IdempotencyUnavailable):
        await store.begin("a:k", "fp", now=1.0, ttl_s=1.0)


async def test_a_gateway_with_a_records_file_replays_after_a_restart(tmp_path: Path) -> None:
    async with running_upstream() as (demo, up):
        config = bounded_config(up, idempotency={"ttl_s": 100.0, "path": str(tmp_path / "idem.db")})
        for _ in range(2):  # the second gateway is the first one restarted
            async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
                result = await lookup(client, "A-1", "order-a1")
                assert not result.is_error
        assert meta_of(result)[REPLAYED_META] is True
        assert demo.served["lookup_order"] == 1


# Through the gateway.


async def test_a_repeated_key_returns_the_recorded_outcome_and_the_upstream_sees_one_call() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
        connect(url, TOKENS["ops-bot"], mode="legacy") as legacy,
    ):
        first = await lookup(client, "A-1", "order-a1")
        assert not first.is_error and first.structured_content == {"order_id": "A-1", "status": "shipped"}
        assert meta_of(first)[KEY_META] == "order-a1"
        assert REPLAYED_META not in meta_of(first)
        again = await lookup(client, "A-1", "order-a1")
        assert again.structured_content == first.structured_content
        assert meta_of(again)[KEY_META] == "order-a1" and meta_of(again)[REPLAYED_META] is True
        # The SDK path (handshake-era client) shares the record.
        legacy_again = await lookup(legacy, "A-1", "order-a1")
        assert legacy_again.structured_content == first.structured_content
        assert meta_of(legacy_again)[REPLAYED_META] is True
        assert demo.served["lookup_order"] == 1
        # Another key with the same arguments is another operation.
        other = await lookup(client, "A-1", "order-a1-bis")
        assert not other.is_error and REPLAYED_META not in meta_of(other)
        assert demo.served["lookup_order"] == 2


async def test_the_same_key_with_other_arguments_is_a_terminal_conflict_and_is_not_forwarded() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        await lookup(client, "A-1", "k-1")
        conflict = await lookup(client, "B-2", "k-1")
        assert conflict.is_error and code_of(conflict) == "idempotency_conflict"
        error = (conflict.structured_content or {})["error"]
        assert error["retryable"] is False and error["idempotency_key"] == "k-1"
        text = conflict.content[0].text  # type: ignore[union-attr]
        assert "k-1" in text and "different arguments" in text
        assert meta_of(conflict)[KEY_META] == "k-1"
        assert demo.served["lookup_order"] == 1


async def test_derived_keys_serve_the_same_call_in_one_run_once_and_anything_else_again() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as ops,
        connect(url, TOKENS["billing-bot"]) as billing,
    ):
        first = await lookup(ops, "A-1")
        key = meta_of(first)[KEY_META]
        assert key == derived_key("ops-bot", "acme", None, "lookup_order", {"order_id": "A-1"})
        again = await lookup(ops, "A-1")
        assert meta_of(again)[REPLAYED_META] is True and meta_of(again)[KEY_META] == key
        assert demo.served["lookup_order"] == 1
        # Other arguments: another derived key, executed.
        assert REPLAYED_META not in meta_of(await lookup(ops, "A-2"))
        assert demo.served["lookup_order"] == 2
        # Another agent never shares a key, even an explicit one.
        assert REPLAYED_META not in meta_of(await lookup(billing, "A-1"))
        await lookup(ops, "Z-9", "shared-key")
        assert REPLAYED_META not in meta_of(await lookup(billing, "Z-9", "shared-key"))
        assert demo.served["lookup_order"] == 5


async def test_a_derived_key_belongs_to_the_run_the_lease_names() -> None:
    keys = LeaseKeys({"k1": LEASE_SECRET.encode()}, signing="k1")

    def lease(run: str) -> str:
        now = time.time()
        return keys.sign(LeaseClaims(run, "ops-bot", "acme", "1.0", 0, now, now + 60))

    async with running_upstream() as (demo, up):
        config = bounded_config(up, leases={"keys": [{"kid": "k1", "secret": LEASE_SECRET}]})
        config["identities"][0]["lease"] = "optional"  # for the call outside any run below
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            run1 = {LEASE_META: lease("run-1")}
            first = await lookup(client, "A-1", **run1)
            assert meta_of(first)[KEY_META] == derived_key(
                "ops-bot", "acme", "run-1", "lookup_order", {"order_id": "A-1"}
            )
            assert meta_of(await lookup(client, "A-1", **run1))[REPLAYED_META] is True
            assert demo.served["lookup_order"] == 1
            # The same call in another run, or outside any run, is another operation.
            other = await lookup(client, "A-1", **{LEASE_META: lease("run-2")})
            assert (
                REPLAYED_META not in meta_of(other) and meta_of(other)[KEY_META] != meta_of(first)[KEY_META]
            )
            assert REPLAYED_META not in meta_of(await lookup(client, "A-1"))
            assert demo.served["lookup_order"] == 3


async def test_cancellable_tools_are_untouched() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        for _ in range(2):
            result = await lookup(client, "A-1", "same-key")
            assert not result.is_error and KEY_META not in meta_of(result)
        assert demo.served["lookup_order"] == 2


async def test_a_refusal_before_the_upstream_does_not_consume_the_key() -> None:
    now = [1_800_000_000.0]  # the gateway's clock: budgets and idempotency records both read it
    async with running_upstream() as (demo, up):
        config = bounded_config(up, limits={"budget": 1, "window_s": 60})
        async with (
            running_gateway(config, clock=lambda: now[0]) as (_, url),
            connect(url, TOKENS["ops-bot"]) as client,
        ):
            await lookup(client, "A-0", "warm-up")  # the window's only call
            refused = await lookup(client, "A-1", "k-budget")
            assert code_of(refused) == "budget_exhausted"
            assert demo.served["lookup_order"] == 1
            # The next window: the key is still free, so the call is made (not outcome_unknown).
            now[0] += 61
            result = await lookup(client, "A-1", "k-budget")
            assert not result.is_error, result
            assert REPLAYED_META not in meta_of(result)
            assert demo.served["lookup_order"] == 2


async def test_keys_expire_after_ttl_s_on_the_gateways_clock() -> None:
    now = [1_800_000_000.0]
    async with running_upstream() as (demo, up):
        config = bounded_config(up, idempotency={"ttl_s": 100})
        async with (
            running_gateway(config, clock=lambda: now[0]) as (_, url),
            connect(url, TOKENS["ops-bot"]) as client,
        ):
            await lookup(client, "A-1", "k-ttl")
            now[0] += 99
            assert meta_of(await lookup(client, "A-1", "k-ttl"))[REPLAYED_META] is True
            now[0] += 1
            # Expired: a new first use, even with other arguments.
            fresh = await lookup(client, "B-1", "k-ttl")
            assert not fresh.is_error and REPLAYED_META not in meta_of(fresh)
            assert demo.served["lookup_order"] == 2


async def test_a_timed_out_bounded_call_is_recorded_and_its_repeat_answers_the_same_refusal() -> None:
    async with running_upstream() as (demo, up):
        config = bounded_config(up, labels={"bounded_deadline_s": 0.3})
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            args = {"seconds": 5}
            first = await client.call_tool("sleep", args)
            assert code_of(first) == "deadline_exceeded"
            again = await client.call_tool("sleep", args)
            assert code_of(again) == "deadline_exceeded" and meta_of(again)[REPLAYED_META] is True
            assert (again.structured_content or {})["error"] == (first.structured_content or {})["error"]
    assert demo.cancelled["sleep"] == 1


async def test_an_error_result_is_an_outcome_and_is_recorded() -> None:
    async with (
        running_upstream(quota=1) as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        await lookup(client, "A-1")  # the upstream's whole quota
        refused = await lookup(client, "A-2")
        assert refused.is_error and code_of(refused) is None  # the upstream's own error result
        again = await lookup(client, "A-2")
        assert again.is_error and meta_of(again)[REPLAYED_META] is True
        assert again.content == refused.content
        assert demo.refused["lookup_order"] == 1


async def test_a_jsonrpc_error_from_the_upstream_frees_the_key() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        # The tool raised: the upstream answered a JSON-RPC error, no outcome, so no record.
        for _ in range(2):
            with pytest.raises(MCPError):
                await client.call_tool("fail", {})
        assert sum(demo.by_key.values()) == 2  # both calls reached the upstream


async def test_a_repeat_while_the_first_call_is_in_flight_is_outcome_unknown() -> None:
    async with running_upstream() as (demo, up):
        config = bounded_config(up)
        config["upstreams"][0]["labels"] = {**BOUNDED, "hold": "bounded"}
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            results: list[CallToolResult] = []

            async def first() -> None:
                results.append(await client.call_tool("hold", {}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                with anyio.fail_after(10):
                    while demo.in_flight == 0:
                        await anyio.sleep(0.01)
                repeat = await client.call_tool("hold", {})
                assert code_of(repeat) == "outcome_unknown"
                assert (repeat.structured_content or {})["error"]["retryable"] is False
                demo.release()
            assert not results[0].is_error
            assert meta_of(await client.call_tool("hold", {}))[REPLAYED_META] is True
            assert demo.served["hold"] == 1


async def test_an_invalid_client_key_is_an_invalid_params_error() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(bounded_config(up)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        for bad in ("", "x" * 256, 42):
            with pytest.raises(MCPError, match="idempotency_key"):
                await lookup(client, "A-1", bad)  # type: ignore[arg-type]
        assert demo.served["lookup_order"] == 0


def test_the_ttl_is_at_least_a_day_outside_development() -> None:
    data = config_dict("http://127.0.0.1:9", idempotency={"ttl_s": 3600})
    assert parse_config(data).idempotency.ttl_s == 3600  # development
    data["gateway"] = {"development": False}
    data["identities"] = []
    data["upstreams"][0].pop("headers")  # plain: development only
    with pytest.raises(ConfigError, match=r"idempotency\.ttl_s.*86400"):
        parse_config(data, "x.toml")
    assert parse_config({**data, "idempotency": {}}).idempotency.ttl_s == 86400


# Redis: shared by gateways, and fail closed.


async def test_two_gateways_sharing_redis_see_each_others_keys_and_redis_down_refuses(
    tmp_path: Path,
) -> None:
    with private_redis(tmp_path) as server:
        counters = {"backend": "redis", "url": server.url, "prefix": unique_prefix(), "timeout_s": 0.5}
        async with running_upstream() as (demo, up):
            config = bounded_config(up, counters=counters)
            # Gateway A counts in memory, so with Redis down its refusal comes from the
            # idempotency check, not from admission.
            async with (
                running_gateway(config, store=MemoryCounters()) as (_, url_a),
                running_gateway(config) as (_, url_b),
                connect(url_a, TOKENS["ops-bot"]) as a,
                connect(url_b, TOKENS["ops-bot"]) as b,
            ):
                first = await lookup(a, "A-1", "fleet-key")
                assert not first.is_error
                replayed = await lookup(b, "A-1", "fleet-key")
                assert meta_of(replayed)[REPLAYED_META] is True
                assert replayed.structured_content == first.structured_content
                assert code_of(await lookup(b, "B-1", "fleet-key")) == "idempotency_conflict"
                derived = await lookup(b, "C-1")
                assert meta_of(await lookup(a, "C-1"))[KEY_META] == meta_of(derived)[KEY_META]
                assert demo.served["lookup_order"] == 2
                server.stop()
                down = await lookup(a, "D-1", "while-down")
                assert code_of(down) == "counters_unavailable"
                assert meta_of(down)[KEY_META] == "while-down"
                assert demo.served["lookup_order"] == 2
