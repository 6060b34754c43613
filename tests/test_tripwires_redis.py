"""A rate tripwire across three gateway processes sharing Redis (issue 13's acceptance): a tenant
limit of 20 refunds per hour allows exactly 20 across them, zero overshoot, and the run of every
call past it (the 21st first) is stopped through the control plane."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
import tomli_w

from gateway_processes import HALTWIRE, Gateway, Processes, wait_ready
from haltwire.identity import Identity
from haltwire.meta import LEASE_META
from haltwire.store.counters.redis import RedisCounters
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from leases_harness import LEASES, mint
from ports import free_port
from redis_process import private_redis, shared_prefix
from stops_harness import control_plane, until
from tripwires_harness import outcome, stops_of

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

LIMIT = 20
RUNS = 30


def gateway_toml(upstream: str, cp: str, port: int, redis_url: str, prefix: str) -> dict[str, Any]:
    data = config_dict(upstream)
    data["gateway"] = {**data["gateway"], "port": port}
    data["counters"] = {"backend": "redis", "url": redis_url, "prefix": prefix, "timeout_s": 10.0}
    data["control"] = {"url": cp, "token": "tok-gateway", "staleness_s": 5.0}
    data["leases"] = LEASES
    data["tripwire_stops"] = {"url": cp, "token": "tok-tripwire"}
    data["tripwires"] = [
        {
            "name": "refunds-per-tenant",
            "kind": "rate",
            "per": "tenant",
            "scope": "run",
            "limit": LIMIT,
            "window_s": 3600.0,
            "tools": ["lookup_order"],
        }
    ]
    return data


async def test_three_gateways_allow_exactly_the_tenant_rate_and_stop_the_runs_past_it(
    tmp_path: Path, procs: Processes
) -> None:
    with shared_prefix("hwtest-tripwires") as (redis_url, prefix):
        async with control_plane(tmp_path / "control.db") as cp, running_upstream() as (demo, up):
            gateways = []
            for i in range(3):
                gw = Gateway(f"gateway-{i}", free_port(), tmp_path / f"gateway-{i}.toml")
                gw.config.write_text(tomli_w.dumps(gateway_toml(up, cp, gw.port, redis_url, prefix)))
                procs.spawn(gw.name, [*HALTWIRE, "gateway", "--config", str(gw.config)])
                gateways.append(gw)
            for gw in gateways:
                await anyio.to_thread.run_sync(wait_ready, procs, gw.name, gw.readyz)
            before = demo.served["lookup_order"]
            seen: dict[str, str | None] = {}

            async def one(run: str, url: str) -> None:
                async with connect(url, TOKENS["ops-bot"]) as client:
                    seen[run] = await outcome(client, run)

            # Every run calls once, all at once, spread over the three gateways.
            async with anyio.create_task_group() as tg:
                for i in range(RUNS):
                    tg.start_soon(one, f"run-{i}", gateways[i % 3].url)

            told = {gw.name: procs.log_tail(gw.name, 800) for gw in gateways}
            assert Counter(seen.values()) == {None: LIMIT, "tripwire_tripped": RUNS - LIMIT}, told
            assert demo.served["lookup_order"] - before == LIMIT, "zero overshoot"
            refused = {run for run, code in seen.items() if code is not None}

            async def every_refused_run_stopped() -> bool:
                stopped = {s["scope"] for s in await stops_of(cp)}
                return stopped == {f"run:{r}" for r in refused}

            await until(every_refused_run_stopped, within=15.0)
            for s in await stops_of(cp):
                assert s["issued_by"] == "tripwire-1" and "refunds-per-tenant (rate, enforce)" in s["reason"]
            # A served run is not stopped; a refused one is refused by its stop everywhere.
            served = next(r for r, c in seen.items() if c is None)
            stopped = next(iter(refused))
            for gw in gateways:
                async with connect(gw.url, TOKENS["ops-bot"]) as client:
                    assert await outcome(client, stopped) in ("stopped", "tripwire_tripped")
            # The tenant's hour is spent: the served run's next call trips the rule too (and its
            # stop then reaches the other gateways).
            async with connect(gateways[0].url, TOKENS["ops-bot"]) as client:
                assert await outcome(client, served) == "tripwire_tripped"


async def test_a_call_takes_one_round_trip_for_its_ceilings_and_admission_tripwires() -> None:
    rules = [
        {"name": "steps", "kind": "steps", "limit": 3},
        {"name": "rate", "kind": "rate", "limit": 100, "window_s": 60, "per": "tenant"},
        {"name": "same", "kind": "repeated_calls", "in_a_row": 10},
    ]
    with shared_prefix("hwtest-tripwires") as (redis_url, prefix):
        store = RedisCounters(redis_url, prefix=prefix, timeout_s=5.0)
        async with running_upstream() as (_, up):
            data = config_dict(up, leases=LEASES, limits={"budget": 100}, tripwires=rules)
            async with (
                running_gateway(data, store=store) as (app, url),
                connect(url, TOKENS["ops-bot"]) as client,
            ):
                for _ in range(3):
                    assert await outcome(client, "run-1") is None
                assert store.round_trips == 3
                assert await outcome(client, "run-1") == "tripwire_tripped"
                assert store.round_trips == 4
                assert await outcome(client, "run-1") == "tripwire_tripped"  # latched: no round trip
                assert store.round_trips == 4
                assert app.gateway.tripwires is not None


async def test_redis_down_fails_closed_at_admission_and_leaves_a_served_result(tmp_path: Path) -> None:
    rules = [
        {"name": "steps", "kind": "steps", "limit": 100},
        {"name": "hits", "kind": "policy_hits", "in_a_row": 3},
    ]
    with private_redis(tmp_path) as server:
        store = RedisCounters(server.url, prefix="hwtest", timeout_s=0.5)
        async with running_upstream() as (_, up):
            data = config_dict(up, leases=LEASES, tripwires=rules)
            async with (
                running_gateway(data, store=store) as (app, url),
                connect(url, TOKENS["ops-bot"]) as client,
            ):
                assert await outcome(client, "run-1") is None
                server.stop()
                assert await outcome(client, "run-1") == "counters_unavailable"
                tripwires = app.gateway.tripwires
                assert tripwires is not None
                # After a served call, an unreachable store is logged: the result stands.
                served = await tripwires.settle(
                    Identity("ops-bot", "acme", "1.0"), "lookup_order", "run-1", {"content": []}
                )
                assert served == {"content": []}
                assert not tripwires.trips


async def test_an_outcome_trip_at_one_gateway_is_refused_at_another_before_its_stop_lands(
    tmp_path: Path,
) -> None:
    """Two gateways on one Redis; the stop cannot be written (503): the second gateway refuses
    the tripped run by the hold alone."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from haltwire.serve import serving
    from stops_harness import gateway_config

    async def unavailable(request: Any) -> Response:
        return JSONResponse({"error": {"code": "unavailable", "message": "down"}}, status_code=503)

    down = Starlette(routes=[Route("/v1/stops", unavailable, methods=["POST"])])
    rules = [{"name": "two-errors", "kind": "policy_hits", "in_a_row": 2}]
    with shared_prefix("hwtest-tripwires") as (redis_url, prefix):
        async with (
            control_plane(tmp_path / "control.db") as cp,
            serving(down) as down_url,
            running_upstream() as (_, up),
        ):
            data = gateway_config(up, cp)
            data["leases"] = LEASES
            data["tripwires"] = rules
            data["tripwire_stops"] = {"url": down_url, "token": "tok-tripwire"}
            data["counters"] = {"backend": "redis", "url": redis_url, "prefix": prefix, "timeout_s": 5.0}
            async with (
                running_gateway(data) as (_, first),
                running_gateway(data) as (_, second),
                connect(first, TOKENS["ops-bot"]) as a,
                connect(second, TOKENS["ops-bot"]) as b,
            ):
                assert [await outcome(a, "run-1", "fail") for _ in range(2)] == ["error", "error"]
                result = await b.call_tool("lookup_order", {}, meta={LEASE_META: mint("run-1")})  # type: ignore[arg-type]
                error = (result.structured_content or {})["error"]
                assert error["code"] == "tripwire_tripped" and "another gateway" in error["message"]
                assert await outcome(b, "run-2") is None, "only the tripped run"
                assert await stops_of(cp) == [], "no stop written: the hold alone refused it"
