"""Calls to irreversible tools become intents: real control plane, gateway, upstream, MCP client."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import Client
from mcp.types import CallToolResult

from control_harness import auth
from haltwire.config import ConfigError
from haltwire.gateway import UpstreamError
from haltwire.gateway.config import parse_config
from haltwire.gateway.idempotency import derived_key
from haltwire.gateway.intents import INTENT_TOOL
from haltwire.meta import KEY_META, LABEL_META, LEASE_META
from haltwire.tokens import LeaseClaims, LeaseKeys
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from intents_harness import intents_config, listed
from stops_harness import control_plane, issue, until

pytestmark = pytest.mark.anyio

ORDER = {"order_id": "A-1"}
LEASE_SECRET = "intents-" + "c" * 40


def intent_of(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    intent: dict[str, Any] = (result.structured_content or {})["intent"]
    return intent


def error_of(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error


async def call(
    client: Client, tool: str, arguments: dict[str, Any], key: str | None = None
) -> CallToolResult:
    if key is None:
        return await client.call_tool(tool, arguments)
    return await client.call_tool(tool, arguments, meta={KEY_META: key})  # type: ignore[arg-type]


async def test_an_irreversible_call_is_recorded_as_an_intent_and_never_reaches_the_upstream(
    tmp_path: Path,
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway(intents_config(up, cp)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert (tools["lookup_order"].meta or {})[LABEL_META] == "irreversible"
        assert (tools[INTENT_TOOL].meta or {})[LABEL_META] == "cancellable"

        result = await call(client, "lookup_order", ORDER)
        intent = intent_of(result)
        key = derived_key("ops-bot", "acme", None, "lookup_order", ORDER)
        assert intent["state"] == "pending" and intent["tool"] == "lookup_order"
        assert intent["idempotency_key"] == key and intent["run_id"] is None
        assert (result.meta or {})[KEY_META] == key
        text = result.content[0].text  # type: ignore[union-attr]
        assert intent["intent_id"] in text and "did not perform" in text
        assert demo.served["lookup_order"] == 0, "an irreversible call never reaches the upstream"

        recorded = await listed(cp)
        assert [(i["intent_id"], i["agent"], i["arguments"], i["state"]) for i in recorded] == [
            (intent["intent_id"], "ops-bot", ORDER, "pending")
        ]

        # The same call again (same derived key): the same intent, nothing new recorded.
        assert intent_of(await call(client, "lookup_order", ORDER))["intent_id"] == intent["intent_id"]
        # A client key: first use records, a repeat answers the same intent, other arguments conflict.
        first = intent_of(await call(client, "lookup_order", {"order_id": "B-2"}, key="refund-B-2"))
        again = intent_of(await call(client, "lookup_order", {"order_id": "B-2"}, key="refund-B-2"))
        assert first["intent_id"] == again["intent_id"] != intent["intent_id"]
        assert first["idempotency_key"] == "refund-B-2"
        conflict = await call(client, "lookup_order", {"order_id": "C-3"}, key="refund-B-2")
        error = error_of(conflict)
        assert (error["code"], error["retryable"], error["idempotency_key"]) == (
            "idempotency_conflict",
            False,
            "refund-B-2",
        )
        assert len(await listed(cp)) == 2

        # Nothing changes for a cancellable tool: it is served by the upstream.
        assert not (await client.call_tool("progress", {"steps": 1})).is_error
        assert demo.served["progress"] == 1 and demo.served["lookup_order"] == 0


#: ops-bot's agent id in another tenant.
BETA_OPS = "tok-beta-ops"


def with_beta(config: dict[str, Any]) -> dict[str, Any]:
    beta = {"agent": "ops-bot", "tenant": "beta", "version": "1.0", "token": BETA_OPS}
    return {**config, "identities": [*config["identities"], beta]}


async def test_an_approval_tool_waits_and_the_status_tool_reads_only_the_agents_own_intents(
    tmp_path: Path,
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        running_upstream() as (demo, up),
        running_gateway(with_beta(intents_config(up, cp))) as (_, url),
        connect(url, TOKENS["ops-bot"]) as ops,
        connect(url, TOKENS["billing-bot"]) as billing,
        connect(url, BETA_OPS) as beta_ops,
    ):
        waiting = intent_of(await call(ops, "sleep", {"seconds": 0}))
        assert waiting["state"] == "awaiting_approval"
        pending = intent_of(await call(ops, "lookup_order", ORDER))
        assert pending["state"] == "pending"
        assert demo.served["sleep"] == 0

        status = await ops.call_tool(INTENT_TOOL, {"intent_id": waiting["intent_id"]})
        shown = intent_of(status)
        assert (shown["intent_id"], shown["state"], shown["needs_approval"]) == (
            waiting["intent_id"],
            "awaiting_approval",
            True,
        )
        # The status tool follows the control plane: an operator's rejection shows at once.
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
            r = await http.post(
                f"/v1/intents/{waiting['intent_id']}/reject",
                json={"reason": "not today"},
                headers=auth("operator"),
            )
        assert r.status_code == 200, r.text
        rejected = intent_of(await ops.call_tool(INTENT_TOOL, {"intent_id": waiting["intent_id"]}))
        assert (rejected["state"], rejected["decision_reason"]) == ("rejected", "not today")

        other = error_of(await billing.call_tool(INTENT_TOOL, {"intent_id": pending["intent_id"]}))
        assert other["code"] == "forbidden" and "another agent" in other["message"]
        assert "ops-bot" not in str(other), "another agent's intent reveals nothing of it"
        # ops-bot of another tenant: acme's ops-bot intent answers as one that does not exist.
        foreign = error_of(await beta_ops.call_tool(INTENT_TOOL, {"intent_id": pending["intent_id"]}))
        assert (foreign["code"], foreign["message"]) == ("unknown_intent", f"No intent has the id {pending['intent_id']}.")
        unknown = error_of(await ops.call_tool(INTENT_TOOL, {"intent_id": "int_nope"}))
        assert unknown["code"] == "unknown_intent"
        assert demo.snapshot()["total_served"] == 0


async def test_a_run_stop_cancels_the_runs_intents_and_refuses_new_ones_recording_nothing(
    tmp_path: Path,
) -> None:
    keys = LeaseKeys({"k1": LEASE_SECRET.encode()}, signing="k1")

    def in_run(run: str) -> dict[str, Any]:
        now = time.time()
        return {LEASE_META: keys.sign(LeaseClaims(run, "ops-bot", "acme", "1.0", 0, now, now + 60))}

    async with control_plane(tmp_path / "control.db") as cp, running_upstream() as (demo, up):
        config = intents_config(up, cp)
        config["leases"] = {"keys": [{"kid": "k1", "secret": LEASE_SECRET}]}
        config["identities"][0]["lease"] = "optional"  # for the status read outside any run below
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:

            async def propose(run: str, order: str) -> CallToolResult:
                return await client.call_tool("lookup_order", {"order_id": order}, meta=in_run(run))  # type: ignore[arg-type]

            before = intent_of(await propose("run-1", "A-1"))
            assert (before["run_id"], before["state"]) == ("run-1", "pending")
            assert before["idempotency_key"] == derived_key(
                "ops-bot", "acme", "run-1", "lookup_order", ORDER
            )

            stop = await issue(cp, "run:run-1", "refund storm")

            async def stopped() -> bool:
                result = await propose("run-1", "Z-9")
                return (
                    bool(result.is_error) and (result.structured_content or {})["error"]["code"] == "stopped"
                )

            await until(stopped)
            error = error_of(await propose("run-1", "Z-9"))
            assert (error["code"], error["stop_id"], error["retryable"]) == (
                "stopped",
                stop["stop_id"],
                False,
            )
            # The status tool goes through the stops too: in the stopped run it is refused ...
            read = {"intent_id": before["intent_id"]}
            in_stopped_run = await client.call_tool(INTENT_TOOL, read, meta=in_run("run-1"))  # type: ignore[arg-type]
            assert error_of(in_stopped_run)["code"] == "stopped"
            # ... and outside it, it shows the stop cancelled what the run had proposed, while the
            # refused calls recorded nothing.
            status = intent_of(await client.call_tool(INTENT_TOOL, {"intent_id": before["intent_id"]}))
            assert (status["state"], status["stop_id"]) == ("cancelled", stop["stop_id"])
            assert [i["intent_id"] for i in await listed(cp, run="run-1")] == [before["intent_id"]]
            # Another run of the same agent still proposes.
            assert intent_of(await propose("run-2", "A-1"))["state"] == "pending"
            assert demo.snapshot()["total_served"] == 0


async def test_an_unreachable_control_plane_fails_closed_and_never_forwards(tmp_path: Path) -> None:
    stop_plane = anyio.Event()

    async def plane(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with control_plane(tmp_path / "control.db") as url:
            task_status.started(url)
            await stop_plane.wait()

    async with running_upstream() as (demo, up), anyio.create_task_group() as tg:
        cp = await tg.start(plane)
        # A long staleness keeps the stop check fresh: the refusal below is the intent desk's.
        config = intents_config(up, cp, staleness_s=60)
        async with running_gateway(config) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            assert intent_of(await call(client, "lookup_order", ORDER))["state"] == "pending"
            stop_plane.set()

            async def refused() -> bool:
                result = await call(client, "lookup_order", {"order_id": "D-4"})
                return result.is_error

            await until(refused)
            result = await call(client, "lookup_order", {"order_id": "D-4"})
            error = error_of(result)
            assert (error["code"], error["retryable"]) == ("registry_unreachable", True)
            key = derived_key("ops-bot", "acme", None, "lookup_order", {"order_id": "D-4"})
            assert (result.meta or {})[KEY_META] == key, "refused by the intent desk, with its key"
            status = error_of(await client.call_tool(INTENT_TOOL, {"intent_id": "int_x"}))
            assert status["code"] == "registry_unreachable"
            assert demo.snapshot()["total_served"] == 0, "never forwarded instead"


async def test_without_intents_enabled_irreversible_calls_are_forwarded_as_before() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(intents_config(up, None)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as client,
    ):
        names = {t.name for t in (await client.list_tools()).tools}
        assert "lookup_order" in names and INTENT_TOOL not in names
        assert not (await call(client, "lookup_order", ORDER)).is_error
        assert demo.served["lookup_order"] == 1


async def test_with_control_intents_are_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp, running_upstream() as (demo, up):
        data = intents_config(up, cp)
        del data["intents"]  # the default with [control]: on
        assert parse_config(data).intents_on
        async with running_gateway(data) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            assert intent_of(await call(client, "lookup_order", ORDER))["state"] == "pending"
        data["intents"] = {"enabled": False}
        async with running_gateway(data) as (_, url), connect(url, TOKENS["ops-bot"]) as client:
            assert not (await call(client, "lookup_order", ORDER)).is_error
        assert demo.served["lookup_order"] == 1
    assert not parse_config(config_dict("http://127.0.0.1:9")).intents_on  # no [control]: off


def test_intents_need_a_control_plane() -> None:
    data = config_dict("http://127.0.0.1:9")
    data["intents"] = {"enabled": True}
    with pytest.raises(ConfigError, match=r"intents.enabled needs \[control\]"):
        parse_config(data)


async def test_approval_for_a_tool_the_upstream_does_not_list_is_a_start_up_error() -> None:
    async with running_upstream() as (_, up):
        config = intents_config(up, None)
        config["upstreams"][0]["approval"] = ["sleep", "wire_money"]
        with pytest.raises(UpstreamError, match=r"upstream 'demo'.*approval.*wire_money"):
            async with running_gateway(config):
                pass
