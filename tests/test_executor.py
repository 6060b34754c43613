"""The executor: real control plane, shop upstream (a side-effect recorder), gateway and MCP client.

Each test runs the executor in-process (``run_executor``) against servers on real sockets;
the crash tests with ``kill -9`` are ``test_executor_crash.py``.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import tomli_w

from cli_process import run_haltwire, run_haltwire_async
from control_harness import TOKEN, auth
from executor_harness import (
    ORDER_IDS,
    as_executor,
    control_plane,
    executor,
    gateway_config,
    intents,
    propose,
    settled,
    shop,
)
from haltwire.control import create_app, parse_control_config
from haltwire.demo.shop import KEY_META
from haltwire.gateway.config import GatewayConfig, parse_config
from haltwire.gateway.intents import INTENT_TOOL
from haltwire.serve import serving
from harness import TOKENS, connect, running_gateway
from runs_harness import config_dict as control_config
from stops_harness import issue, until

pytestmark = pytest.mark.anyio

async def test_an_agents_refund_becomes_an_intent_the_executor_commits_once(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        shop(tmp_path) as (s, up),
        running_gateway(gateway_config(up, cp)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        args = {"order_id": "A-1002", "amount_cents": 2500}
        proposed = await client.call_tool("issue_refund", args, meta={KEY_META: "refund-A-1002"})  # type: ignore[arg-type]
        intent = (proposed.structured_content or {})["intent"]
        assert intent["state"] == "pending" and s.ledger()["applied"] == 0, "the agent only proposes"

        async with executor(gateway_config(up, cp)) as ex:
            done = await settled(cp, 1)
            assert ex.settled == {intent["intent_id"]: "committed"}
        committed = done["refund-A-1002"]
        ledger = s.ledger()
        assert committed["state"] == "committed" and committed["checked_revision"] is not None
        assert [
            (r["idempotency_key"], r["order_id"], r["amount_cents"], r["requests"]) for r in ledger["refunds"]
        ] == [("refund-A-1002", "A-1002", 2500, 1)]
        assert committed["outcome"]["structuredContent"]["refund_id"] == ledger["refunds"][0]["refund_id"]
        assert committed["claimed_by"] == "executor-1"

        # The agent reads the outcome through the gateway's status tool.
        status = await client.call_tool(INTENT_TOOL, {"intent_id": intent["intent_id"]})
        shown = (status.structured_content or {})["intent"]
        assert shown["state"] == "committed" and shown["outcome"]["structuredContent"]["order_id"] == "A-1002"


async def test_a_stop_cancels_pending_and_claimed_unchecked_intents_and_the_check_says_so(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        first = await propose(cp, "k-1")
        await propose(cp, "k-2", run="r-2")
        claimed = (await as_executor(cp, "POST", "/v1/intents/claim")).json()
        assert claimed["intent_id"] == first["intent_id"]

        stop = await issue(cp, "tenant:acme")
        # Before the stop was answered: the pending one and the claimed one never checked
        # (an executor holds it, but its call was not made).
        now = await intents(cp)
        for key in ("k-1", "k-2"):
            assert (now[key]["state"], now[key]["stop_id"], now[key]["checked_revision"]) == (
                "cancelled",
                stop["stop_id"],
                None,
            )
        # The executor's check tells it, every time it asks: stopped, not performed.
        for _ in range(2):
            r = await as_executor(cp, "POST", f"/v1/intents/{first['intent_id']}/check")
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert (error["code"], error["stop_id"], error["intent"]["state"]) == (
                "stopped",
                stop["stop_id"],
                "cancelled",
            )


async def test_a_passed_check_is_never_cancelled_and_a_repeated_check_answers_the_first(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        intent = await propose(cp, "k-1")
        await as_executor(cp, "POST", "/v1/intents/claim")
        r = await as_executor(cp, "POST", f"/v1/intents/{intent['intent_id']}/check")
        assert r.status_code == 200, r.text
        revision = r.json()["checked_revision"]
        stop = await issue(cp, "run:r-1")
        assert stop["revision"] > revision
        # The stop came after the decision: the check answers the first one, not the stop.
        again = await as_executor(cp, "POST", f"/v1/intents/{intent['intent_id']}/check")
        assert again.status_code == 200 and again.json()["checked_revision"] == revision
        assert (await intents(cp))["k-1"]["state"] == "claimed"
        # Only an executor checks; an unknown intent is 404.
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            r = await http.post(f"/v1/intents/{intent['intent_id']}/check", headers=auth("operator"))
        assert r.status_code == 403 and r.json()["error"]["needed_roles"] == ["executor"]
        assert (await as_executor(cp, "POST", "/v1/intents/nope/check")).status_code == 404


async def test_the_per_run_limit_writes_a_stop_and_cancels_the_intent_past_it(tmp_path: Path) -> None:
    limits = [{"tool": "issue_refund", "per_run": 2}]
    async with control_plane(tmp_path / "control.db", intent_limits=limits) as cp, shop(tmp_path) as (s, up):
        for n in range(3):
            await propose(cp, f"k-{n}", order=f"A-100{n + 1}")
        await propose(cp, "other-run", order="A-1009", run="r-9")
        async with executor(gateway_config(up, cp)):
            done = await settled(cp, 4)
        states = {k: i["state"] for k, i in done.items()}
        assert states == {
            "k-0": "committed",
            "k-1": "committed",
            "k-2": "cancelled",
            "other-run": "committed",
        }
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            stops = (await http.get("/v1/stops", headers=auth("operator"))).json()["stops"]
        assert [(x["scope"], x["issued_by"]) for x in stops] == [("run:r-1", "intent-limit")]
        assert (
            done["k-2"]["stop_id"] == stops[0]["stop_id"] and "more than 2 issue_refund" in stops[0]["reason"]
        )
        assert sorted(r["idempotency_key"] for r in s.ledger()["refunds"]) == ["k-0", "k-1", "other-run"]


async def test_four_workers_past_a_runs_limit_leave_one_stop_that_cancels_the_rest(tmp_path: Path) -> None:
    limits = [{"tool": "issue_refund", "per_run": 2}]
    async with control_plane(tmp_path / "control.db", intent_limits=limits) as cp, shop(tmp_path) as (s, up):
        for n in range(8):
            await propose(cp, f"k-{n}", order=ORDER_IDS[n])
        config = gateway_config(up, cp)
        config["executor"]["workers"] = 4
        async with executor(config):
            done = await settled(cp, 8)
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            stops = (await http.get("/v1/stops?all=1", headers=auth("operator"))).json()["stops"]
        assert [(x["scope"], x["issued_by"]) for x in stops] == [("run:r-1", "intent-limit")]
        states = sorted(i["state"] for i in done.values())
        assert states == ["cancelled"] * 6 + ["committed"] * 2
        assert {i["stop_id"] for i in done.values() if i["state"] == "cancelled"} == {stops[0]["stop_id"]}
        committed = sorted(k for k, i in done.items() if i["state"] == "committed")
        assert sorted(r["idempotency_key"] for r in s.ledger()["refunds"]) == committed


async def test_a_restarted_executor_resolves_what_it_held_with_the_same_key_never_twice(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (s, up):
        # A crash before the check: claimed, never checked, never performed.
        early = await propose(cp, "early", order="A-1001")
        assert (await as_executor(cp, "POST", "/v1/intents/claim")).json()["intent_id"] == early["intent_id"]
        # A crash after the upstream applied it but before the outcome was recorded.
        late = await propose(cp, "late", order="A-1002")
        assert (await as_executor(cp, "POST", "/v1/intents/claim")).json()["intent_id"] == late["intent_id"]
        assert (await as_executor(cp, "POST", f"/v1/intents/{late['intent_id']}/check")).status_code == 200
        async with connect(f"{up}/mcp", None) as direct:
            applied = await direct.call_tool("issue_refund", late["arguments"], meta={KEY_META: "late"})  # type: ignore[arg-type]
        assert not applied.is_error
        # A crash before the check, and a stop since: cancelled, not performed.
        stopped = await propose(cp, "stopped", order="A-1003", run="r-3")
        assert (await as_executor(cp, "POST", "/v1/intents/claim")).json()["intent_id"] == stopped[
            "intent_id"
        ]
        stop = await issue(cp, "run:r-3")

        async with executor(gateway_config(up, cp)):
            done = await settled(cp, 3)
        assert {k: i["state"] for k, i in done.items()} == {
            "early": "committed",
            "late": "committed",
            "stopped": "cancelled",
        }
        assert done["stopped"]["stop_id"] == stop["stop_id"]
        ledger = s.ledger()
        assert {r["idempotency_key"]: r["requests"] for r in ledger["refunds"]} == {"early": 1, "late": 2}
        assert ledger["by_order"] == {"A-1001": 1, "A-1002": 1}, "each order refunded once"
        late_refund = next(r for r in ledger["refunds"] if r["idempotency_key"] == "late")
        assert done["late"]["outcome"]["structuredContent"]["refund_id"] == late_refund["refund_id"]


async def test_a_stop_on_the_executor_ends_its_lease_and_it_claims_nothing_until_cleared(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (s, up):
        async with executor(gateway_config(up, cp)):
            stop = await issue(cp, "agent:executor-1")
            await anyio.sleep(0.3)  # the push reaches the executor's lease
            await propose(cp, "k-1")
            await anyio.sleep(0.5)
            assert (await intents(cp))["k-1"]["state"] == "pending" and s.ledger()["applied"] == 0
            async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
                r = await http.post(
                    f"/v1/stops/{stop['stop_id']}/clear", json={"reason": "ok"}, headers=auth("operator")
                )
            assert r.status_code == 200
            done = await settled(cp, 1)
        assert done["k-1"]["state"] == "committed" and s.ledger()["applied"] == 1


async def test_error_results_and_unknown_tools_fail_the_intent_and_apply_nothing(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (s, up):
        await propose(cp, "too-much", cents=50_000)  # over the $200 cap: the shop refuses
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            body = {
                "agent": "ops-bot", "tenant": "acme", "version": "1.0", "tool": "wire_money",
                "arguments": {}, "idempotency_key": "no-such-tool",
            }  # fmt: skip
            assert (await http.post("/v1/intents", json=body, headers=auth("gateway"))).status_code == 201
        async with executor(gateway_config(up, cp)):
            done = await settled(cp, 2)
        assert done["too-much"]["state"] == "failed" and "200" in done["too-much"]["error"]
        assert done["no-such-tool"]["state"] == "failed" and "wire_money" in done["no-such-tool"]["error"]
        assert s.ledger()["applied"] == 0


async def test_the_executor_keeps_an_outcome_until_the_control_plane_records_it(tmp_path: Path) -> None:
    """The control plane goes away between the call and the commit: the executor asks again."""
    from tcp_proxy import TcpProxy

    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path, delay_s=0.5) as (s, up):
        async with TcpProxy.running(int(cp.rsplit(":", 1)[1])) as proxy:
            config = gateway_config(up, cp)
            config["control"]["url"] = proxy.url
            await propose(cp, "k-1")
            async with executor(config):

                async def checked() -> bool:
                    return (await intents(cp))["k-1"]["checked_revision"] is not None

                await until(checked, 10)
                proxy.block()  # the refund is on its way (0.5 s); its commit cannot get through
                await until(lambda: anyio.to_thread.run_sync(lambda: s.ledger()["applied"] == 1), 10)
                await anyio.sleep(1.0)
                assert (await intents(cp))["k-1"]["state"] == "claimed"
                proxy.unblock()
                done = await settled(cp, 1)
        assert done["k-1"]["state"] == "committed" and s.ledger()["refunds"][0]["requests"] == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rounds", [8, pytest.param(25, marks=pytest.mark.soak)], ids=["8-rounds", "25-rounds"])
async def test_stops_raced_against_commits_cancel_every_pending_intent_and_commit_none_after(
    tmp_path: Path, store: dict[str, Any], rounds: int
) -> None:
    """Many rounds: intents of one run flow to four executor workers while a stop for the run
    lands at a random moment. Once the stop is answered nothing of the run is pending; every
    intent ends cancelled by that stop (never applied) or committed after a check at a revision
    below the stop's (applied once); nothing else. 8 rounds in the default run; the soak variant
    (``-m soak``) runs the 25 rounds of the issue's closing note."""
    rng = random.Random(5)
    per_round = 8
    seen = {"committed": 0, "cancelled": 0}
    async with control_plane(store) as cp, shop(tmp_path, delay_s=0.005) as (s, up):
        config = gateway_config(up, cp)
        config["executor"]["workers"] = 4
        async with executor(config):
            for n in range(rounds):
                run = f"race-{n}"
                keys = [f"{run}-{i}" for i in range(per_round)]
                async with anyio.create_task_group() as tg:
                    for i, key in enumerate(keys):
                        tg.start_soon(propose, cp, key, ORDER_IDS[i % len(ORDER_IDS)], 1000, run)
                await anyio.sleep(rng.uniform(0, 0.06))
                stop = await issue(cp, f"run:{run}")
                now = {k: i for k, i in (await intents(cp)).items() if i["run_id"] == run}
                assert not [k for k, i in now.items() if i["state"] == "pending"], "pending after the stop"

                async def run_settled() -> bool:
                    mine = [i for i in (await intents(cp)).values() if i["run_id"] == run]  # noqa: B023
                    return all(i["state"] in ("committed", "cancelled") for i in mine)

                await until(run_settled, 20)
                final = {k: i for k, i in (await intents(cp)).items() if i["run_id"] == run}
                applied = {r["idempotency_key"]: r for r in s.ledger()["refunds"]}
                for key in keys:
                    intent = final[key]
                    if intent["state"] == "cancelled":
                        assert intent["stop_id"] == stop["stop_id"] and key not in applied, intent
                    else:
                        assert intent["state"] == "committed", intent
                        assert intent["checked_revision"] < stop["revision"], (intent, stop)
                        assert applied[key]["requests"] == 1
                    seen[intent["state"]] += 1
    # The race was real: both outcomes happened, in the same run and across runs.
    assert seen["committed"] > 0 and seen["cancelled"] > 0, seen


def run_cli(config: Path, text: str) -> subprocess.CompletedProcess[str]:
    config.write_text(text)
    return run_haltwire("executor", "--config", str(config), timeout=60)


def test_the_cli_names_a_bad_config_or_an_upstream_that_does_not_start_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    base = '[gateway]\ndevelopment = true\n\n[[upstreams]]\nname = "u"\nurl = "http://127.0.0.1:9/mcp"\n'
    base += "connect_timeout_s = 1\n"
    done = run_cli(config, base)
    assert done.returncode == 2 and "executor: the section is missing" in done.stderr
    done = run_cli(config, base + '\n[executor]\ntoken = "t"\n')
    assert done.returncode == 2 and "add [control]" in done.stderr
    done = run_cli(
        config,
        base
        + '\n[executor]\ntoken_env = "HALTWIRE_TEST_UNSET"\n\n[control]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n',
    )
    assert done.returncode == 2 and "HALTWIRE_TEST_UNSET is not set" in done.stderr
    done = run_cli(
        config, base + '\n[executor]\ntoken = "t"\n\n[control]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n'
    )
    assert done.returncode == 2 and "upstream" in done.stderr and "u" in done.stderr, done.stderr


def test_gateway_config_rejects_a_plain_executor_token_outside_development() -> None:
    data = gateway_config("http://127.0.0.1:9", "http://127.0.0.1:8")
    data["gateway"]["development"] = False
    data["identities"] = []
    data["upstreams"][0].pop("headers")  # plain: development only
    data["control"] = {"url": "http://127.0.0.1:8", "token_env": "X"}
    from haltwire.config import ConfigError

    with pytest.raises(ConfigError, match="executor: plain 'token'"):
        parse_config(data)
    assert isinstance(parse_config({**data, "executor": {"token_env": "Y"}}), GatewayConfig)


async def test_an_intent_awaiting_approval_is_performed_only_once_approved(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (s, up):
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:

            async def awaiting(key: str, order: str) -> str:
                body = {
                    "run_id": "r-1", "agent": "ops-bot", "tenant": "acme", "version": "1.0",
                    "tool": "issue_refund", "arguments": {"order_id": order, "amount_cents": 900},
                    "idempotency_key": key, "needs_approval": True,
                }  # fmt: skip
                r = await http.post("/v1/intents", json=body, headers=auth("gateway"))
                assert r.status_code == 201 and r.json()["state"] == "awaiting_approval", r.text
                return str(r.json()["intent_id"])

            approved, rejected = await awaiting("ok", "A-1001"), await awaiting("no", "A-1002")
            async with executor(gateway_config(up, cp)):
                await anyio.sleep(0.5)  # the executor polls: nothing is claimable yet
                assert s.ledger()["applied"] == 0
                assert (
                    await http.post(f"/v1/intents/{approved}/approve", headers=auth("operator"))
                ).status_code == 200
                r = await http.post(
                    f"/v1/intents/{rejected}/reject", json={"reason": "no"}, headers=auth("operator")
                )
                assert r.status_code == 200
                done = await settled(cp, 2)
        assert (done["ok"]["state"], done["no"]["state"]) == ("committed", "rejected")
        assert [r["idempotency_key"] for r in s.ledger()["refunds"]] == ["ok"]


async def test_a_control_plane_that_refuses_the_executor_for_good_is_exit_2_and_one_sentence(
    tmp_path: Path,
) -> None:
    """An unknown token, the wrong role, or no [leases]: the executor says so and stops, it
    does not retry forever."""
    no_leases = control_config({"backend": "sqlite", "path": str(tmp_path / "c.db")}, leases=False)
    async with (
        serving(create_app(parse_control_config(no_leases)), graceful_s=1) as cp,
        shop(tmp_path) as (_, up),
    ):
        cases = {
            "tok-nobody": "401 unauthenticated",
            TOKEN["gateway"]: "403 forbidden",
            TOKEN["executor"]: "501 leases_not_configured",
        }
        for token, expected in cases.items():
            config = gateway_config(up, cp)
            config["executor"]["token"] = token
            path = tmp_path / "gateway.toml"
            path.write_text(tomli_w.dumps(config))
            done = await run_haltwire_async("executor", "--config", str(path))
            err = done.stderr
            assert done.returncode == 2, err
            last = err.strip().splitlines()[-1]
            assert last.startswith("haltwire executor: the control plane refused the executor"), err
            assert expected in last and "Traceback" not in err, err


async def test_sigterm_stops_the_executor_cleanly_with_exit_0(tmp_path: Path) -> None:
    """SIGTERM is a clean stop, as for the gateway and the control plane (exit 0, not 143)."""
    registry = {"backend": "sqlite", "path": str(tmp_path / "c.db")}
    async with (
        serving(create_app(parse_control_config(control_config(registry))), graceful_s=1) as cp,
        shop(tmp_path) as (_, up),
    ):
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(gateway_config(up, cp)))
        command = [sys.executable, "-m", "haltwire", "executor", "--config", str(path)]
        async with await anyio.open_process(command, stderr=subprocess.PIPE) as proc:
            assert proc.stderr is not None
            said = b""
            with anyio.fail_after(30):
                while b"committing intents through" not in said:
                    said += await proc.stderr.receive()
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                assert await proc.wait() == 0, said
