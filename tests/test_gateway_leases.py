"""The gateway verifies leases (level 3): real gateway, real upstream, real MCP client.

Tokens are made here exactly as the control plane makes them (``LeaseKeys.sign``). Every
case runs on both paths where they differ: the fast path (a modern ``tools/call``) and the
SDK server path (``mode="legacy"``).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx2
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from haltwire.config import ConfigError
from haltwire.gateway.ceilings import RUN_WINDOW_S
from haltwire.gateway.config import parse_config
from haltwire.gateway.leases import LeaseCheck
from haltwire.identity import Identity
from haltwire.meta import LEASE_META, RUN_META
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseKeys
from harness import TOKENS, config_dict, running_gateway, running_upstream
from leases_harness import (
    K1,
    K2,
    LEASES,
    PATHS,
    SECRET_1,
    SECRET_2,
    GatewayClock,
    call,
    client,
    code,
    mint,
    tamper,
)
from redis_process import shared_prefix
from stops_harness import clear, control_plane, gateway_config, issue, until
from upstream_harness import recorded_upstream

pytestmark = pytest.mark.anyio

@pytest.mark.parametrize("path", PATHS)
async def test_a_valid_lease_is_served_and_every_bad_one_refused_before_the_upstream(path: str) -> None:
    clock = GatewayClock()
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, leases=LEASES), clock=clock) as (_, url),
        client(url, path=path) as ops,
    ):
        good = mint("run-1")
        assert await call(ops, good) is None
        assert await call(ops, good, run="run-1") is None
        assert code(await call(ops)) == "lease_invalid", "no token: with [leases], required by default"
        served = demo.served["lookup_order"]

        forged = mint("run-1", keys=LeaseKeys({"k1": b"x" * 40}, signing="k1"))
        cases = {
            "forged": forged,
            "tampered": tamper(good, run="run-2"),
            "tampered generation": tamper(good, gen=10**9),
            "unknown key": mint("run-1", keys=K2),
            "not a JWT": "not-a-token",
            "not a string": 12345,
        }
        for what, token in cases.items():
            error = await call(ops, token)
            assert code(error) == "lease_invalid", what
            assert error is not None and error["retryable"] is False

        other = await call(ops, mint("run-1", agent="billing-bot"))
        assert code(other) == "lease_invalid" and other is not None
        assert "issued to another identity" in other["message"]

        wrong_run = await call(ops, good, run="run-2")
        assert code(wrong_run) == "lease_invalid" and wrong_run is not None
        assert "run-1" in wrong_run["message"]

        # Expiry is the gateway's clock's call, with no leeway: the same token is good until
        # the gateway's clock reaches exp, whatever the runtime's clock said when it got it.
        clock.offset = 59.0
        assert await call(ops, good) is None
        clock.offset = 60.5
        expired = await call(ops, good)
        assert code(expired) == "lease_expired" and expired is not None
        assert expired["retryable"] is False and "run-1" in expired["message"]
        # A grant stamped far in the future (a skewed clock) lives to its exp, no longer.
        future = mint("run-1", issued_at=time.time() + 3600, ttl_s=60)
        assert await call(ops, future) is None
        clock.offset = 3600 + 60.0
        assert code(await call(ops, future)) == "lease_expired"
        # A grant stamped in the past is already expired at the gateway.
        clock.offset = 0.0
        assert code(await call(ops, mint("run-1", issued_at=time.time() - 120))) == "lease_expired"

        # Served after the refusals: the token at 59 s and the future-stamped one, nothing else.
        assert demo.served["lookup_order"] == served + 2


@pytest.mark.parametrize("path", PATHS)
async def test_the_header_carries_a_lease_and_a_malformed_one_is_refused(path: str) -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, leases=LEASES, limits={"run_steps": 1})) as (_, url),
    ):
        async with client(url, path=path, lease_header=mint("run-h")) as ops:
            assert await call(ops) is None
            # The header names run-h: its step budget (1) is spent.
            assert code(await call(ops)) == "budget_exhausted"
            # _meta wins over the header.
            assert await call(ops, mint("run-m")) is None
        for bad in ("garbage", "a.b.c", "eyJhbGciOiJIUzI1NiJ9.!!!.???", "x" * 5000):
            async with client(url, path=path, lease_header=bad) as ops:
                assert code(await call(ops)) == "lease_invalid", bad
    assert demo.served["lookup_order"] == 2


async def test_a_raw_json_rpc_call_with_the_header_takes_the_fast_path() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, leases=LEASES)) as (_, url),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "lookup_order", "arguments": {"order_id": "A-1"}, "_meta": meta},
        }
        headers = {
            "Authorization": f"Bearer {TOKENS['ops-bot']}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "lookup_order",
        }
        results = []
        # A valid lease, a header of non-ASCII bytes, and a lease of another identity.
        leases = [mint("run-1").encode(), "\u00e9t\u00e9".encode(), mint("run-1", "billing-bot").encode()]
        for lease in leases:
            sent = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"haltwire-lease", lease)]
            r = await http.post(url, headers=sent, json=body)
            assert r.status_code == 200, r.text
            results.append(r.json()["result"])
    assert not results[0].get("isError")
    assert [r["structuredContent"]["error"]["code"] for r in results[1:]] == ["lease_invalid"] * 2
    assert demo.served["lookup_order"] == 1


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("lease", [None, "required"], ids=["lease unset", "lease required"])
async def test_without_a_lease_an_identity_is_refused_unless_it_opts_out(
    path: str, lease: str | None
) -> None:
    async with running_upstream() as (demo, up):
        data = config_dict(up, leases=LEASES)
        if lease is not None:
            data["identities"][0]["lease"] = lease  # ops-bot
        data["identities"][1]["lease"] = "optional"  # billing-bot: the explicit opt-out
        async with (
            running_gateway(data) as (_, url),
            client(url, path=path) as ops,
            client(url, "billing-bot", path=path) as billing,
        ):
            missing = await call(ops)
            assert code(missing) == "lease_invalid" and missing is not None
            assert "ops-bot sent no lease" in missing["message"]
            assert 'lease = "optional"' in missing["message"], "the sentence names the fix"
            assert await call(ops, mint("run-1")) is None
            assert await call(billing) is None, "billing-bot opted out"
    assert demo.served["lookup_order"] == 2


async def test_rotation_a_gateway_with_both_keys_accepts_tokens_of_either() -> None:
    keys = [{"kid": "k1", "secret": SECRET_1}, {"kid": "k2", "secret": SECRET_2}]
    async with (
        running_upstream() as (_, up),
        running_gateway(config_dict(up, leases={"keys": keys})) as (_, url),
        client(url) as ops,
    ):
        assert await call(ops, mint("run-old", keys=K1)) is None
        assert await call(ops, mint("run-new", keys=K2)) is None
        k3 = LeaseKeys({"k3": b"3" * 40}, signing="k3")
        assert code(await call(ops, mint("run-x", keys=k3))) == "lease_invalid"


@pytest.mark.parametrize("path", PATHS)
async def test_a_run_step_budget_ends_one_run_and_not_the_identitys_other_runs(path: str) -> None:
    async with running_upstream() as (demo, up):
        data = config_dict(up, leases=LEASES, limits={"run_steps": 100})
        data["identities"][0]["limits"] = {"run_steps": 3}  # ops-bot's own override
        data["identities"][0]["lease"] = "optional"  # for the call in no run below
        async with running_gateway(data) as (_, url), client(url, path=path) as ops:
            a, b = mint("run-a"), mint("run-b")
            # A refused call counts nothing: these do not spend run-a's steps.
            assert code(await call(ops, a, run="run-z")) == "lease_invalid"
            for _ in range(3):
                assert await call(ops, a) is None
            exhausted = await call(ops, a)
            assert code(exhausted) == "budget_exhausted" and exhausted is not None
            assert exhausted["retryable"] is False and exhausted["run"] == "run-a"
            assert "run-a" in exhausted["message"] and "resets_at" not in exhausted
            assert await call(ops, b) is None, "another run of the same identity"
            assert await call(ops) is None, "a call in no run has no run budget"
            # A new token for the same run (a renewal) does not restart the count.
            assert code(await call(ops, mint("run-a", issued_at=time.time() + 1))) == "budget_exhausted"
    assert demo.served["lookup_order"] == 5


@pytest.mark.parametrize("path", PATHS)
async def test_run_stops_and_the_fencing_generation_with_a_real_control_plane(
    tmp_path: Path, path: str
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway({**gateway_config(up, cp), "leases": LEASES}) as (_, url),
        client(url, path=path) as ops,
        client(url, "billing-bot", path=path) as billing,
    ):
        late = 10**6  # a generation after every stop in this test
        r, other = mint("run-r", generation=late), mint("run-other", generation=late)
        assert await call(ops, r) is None
        stop = await issue(cp, "run:run-r", "loops")

        async def stopped() -> bool:
            return code(await call(ops, r)) == "stopped"

        await until(stopped)
        before = demo.served["lookup_order"]
        error = await call(ops, r)
        assert error is not None and (error["scope"], error["stop_id"]) == ("run:run-r", stop["stop_id"])
        assert await call(ops, other) is None, "another run of the same agent"
        assert code(await call(ops)) == "lease_invalid", "no lease: no way around the run's stop"
        assert await call(billing, mint("run-b", "billing-bot", generation=late)) is None
        assert demo.served["lookup_order"] == before + 2

        await clear(cp, stop["stop_id"])

        async def served() -> bool:
            return await call(ops, r) is None

        await until(served)
        # A lease granted before the stop stays refused after the clear; one granted at or
        # after the stop's revision is good.
        stale = await call(ops, mint("run-r", generation=stop["revision"] - 1))
        assert code(stale) == "lease_invalid" and stale is not None
        assert "granted before stop" in stale["message"]
        assert await call(ops, mint("run-r", generation=stop["revision"])) is None
        # The fence is the run's: other runs of the agent are not fenced by it.
        assert await call(ops, mint("run-other", generation=0)) is None
        # An agent stop fences every run of the agent, even once cleared.
        agent_stop = await issue(cp, "agent:ops-bot")
        await clear(cp, agent_stop["stop_id"])

        async def fenced() -> bool:
            return (
                code(await call(ops, mint("run-other", generation=agent_stop["revision"] - 1)))
                == "lease_invalid"
            )

        await until(fenced)
        assert await call(billing, mint("run-b", "billing-bot", generation=0)) is None


def test_the_lease_config_is_checked_at_start_up() -> None:
    up = "http://127.0.0.1:9"
    required = config_dict(up)
    required["identities"][0]["lease"] = "required"
    with pytest.raises(ConfigError, match=r"ops-bot require a lease.*no \[leases\]"):
        parse_config(required)
    with pytest.raises(ConfigError, match="a gateway only verifies"):
        parse_config(config_dict(up, leases={**LEASES, "signing_key": "k1"}))
    production = config_dict(up, leases=LEASES, gateway={"development": False})
    production["identities"] = []
    with pytest.raises(ConfigError, match="plain 'secret'"):
        parse_config(production)
    with pytest.raises(ConfigError, match="run_steps"):
        parse_config(config_dict(up, limits={"run_steps": -1}))
    config = parse_config(config_dict(up, leases=LEASES, limits={"run_steps": 5}))
    assert config.leases is not None and config.limits.run_steps == 5


async def test_a_run_budget_in_redis_is_shared_by_gateways_and_outlives_any_lease() -> None:
    with shared_prefix("hwlease") as (redis_url, prefix):
        async with running_upstream() as (demo, up):
            counters = {"backend": "redis", "url": redis_url, "prefix": prefix}
            data = config_dict(up, leases=LEASES, counters=counters, limits={"run_steps": 3})
            async with (
                running_gateway(data) as (_, url_1),
                running_gateway(data) as (_, url_2),
                client(url_1) as one,
                client(url_2) as two,
            ):
                lease = mint("run-shared", ttl_s=30)
                assert [await call(one, lease), await call(two, lease), await call(one, lease)] == [None] * 3
                assert code(await call(two, lease)) == "budget_exhausted"
                assert code(await call(one, lease)) == "budget_exhausted"
                assert await call(two, mint("run-next")) is None
        r = redis.Redis.from_url(redis_url)
        try:
            ttl_ms = r.pttl(f"{prefix}:{{acme/ops-bot@1.0}}:r:run-shared:0")
        finally:
            r.close()
        # Kept for the run window (days), not for one lease (seconds): a renewed lease
        # cannot find its run's count gone and start again.
        assert ttl_ms > RUN_WINDOW_S * 1000 * 0.9
    assert demo.served["lookup_order"] == 4


@settings(max_examples=50, deadline=None)  # no per-example deadline: the machine is shared
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_header_text_is_a_refusal_never_an_exception(text: str) -> None:
    check = LeaseCheck(K1)
    outcome = check.check(Identity("ops-bot", "acme", "1.0"), None, text)
    assert isinstance(outcome, Refusal) and outcome.code == "lease_invalid"
    # The same, in a JWT's shape: three dot-separated parts of it.
    shaped = check.check(Identity("ops-bot", "acme", "1.0"), {LEASE_META: f"{text}.{text}.{text}"}, None)
    assert isinstance(shaped, Refusal) and shaped.code == "lease_invalid"


@pytest.mark.parametrize("path", PATHS)
async def test_the_lease_token_stops_at_the_gateway_and_the_rest_of_meta_goes_on(path: str) -> None:
    async with (
        recorded_upstream() as (_, up, seen),
        running_gateway(config_dict(up, leases=LEASES)) as (_, url),
        client(url, path=path) as ops,
    ):
        token = mint("run-1")
        meta = {LEASE_META: token, RUN_META: "run-1", "trace": "t-1"}
        result = await ops.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)  # type: ignore[arg-type]
        assert not result.is_error
    forwarded = seen.calls()[-1]
    assert token not in forwarded.body.decode()
    sent = forwarded.json()["params"]["_meta"]
    assert LEASE_META not in sent and (sent[RUN_META], sent["trace"]) == ("run-1", "t-1")
