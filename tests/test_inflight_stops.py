"""Issue 12, point 2: a stop reaches the calls already in flight at the gateway.

Real servers on loopback: a control plane (SQLite), three demo upstreams whose ``sleep`` tool is
labelled ``cancellable``, ``bounded`` and ``irreversible`` (prefixes ``read_``, ``job_``,
``pay_``), a gateway following the control plane, and the official MCP client under a lease.
A stop issued through the control plane's API while the calls run: the cancellable one is cut
(the upstream sees its request cancelled, the agent gets ``stopped``), the bounded and the
irreversible ones finish, and the run report says which happened to each.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.types import CallToolResult

from control_harness import raw_sql
from haltwire.config import ControlLink
from haltwire.demo.stack import (
    CONTROL_TOKENS,
    LEASE_KEYS,
    TOKENS,
    connect,
    demo_config,
    running_control_plane,
    running_gateway,
    running_upstream,
)
from haltwire.demo.upstream import DemoUpstream
from haltwire.gateway.app import GatewayApp
from haltwire.gateway.inflight import Call, InFlight
from haltwire.identity import Identity
from haltwire.meta import LEASE_META
from haltwire.refusal import Refusal
from haltwire.runtime import ControlClient, Lease
from haltwire.watch import StopWatch
from leases_harness import PATHS

pytestmark = pytest.mark.anyio

OPERATOR = {"Authorization": f"Bearer {CONTROL_TOKENS['operator']}"}
#: Far longer than any bound below (and shorter than the 30 s label deadline): a call that was
#: not cut cannot pass for one that was.
LONG_S = 20.0
#: The bounded and irreversible calls: long enough for the stop to land while they run.
SHORT_S = 2.0


@dataclass
class Stack:
    control_url: str
    gateway: GatewayApp
    gateway_url: str
    upstreams: dict[str, DemoUpstream]
    db: Path


@asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    db = tmp_path / "control.db"
    async with (
        running_control_plane(db) as control_url,
        running_upstream() as (reads, reads_url),
        running_upstream() as (jobs, jobs_url),
        running_upstream() as (payments, payments_url),
    ):
        link = {"url": control_url, "token": CONTROL_TOKENS["gateway"], "staleness_s": 5.0}
        # Intents off: an irreversible call is forwarded under its deadline, the case to protect.
        data = demo_config(reads_url, control=link, leases={"keys": LEASE_KEYS}, intents={"enabled": False})
        data["upstreams"] = [
            {
                "name": "reads",
                "url": f"{reads_url}/mcp",
                "prefix": "read_",
                "labels": {"sleep": "cancellable"},
            },
            {"name": "jobs", "url": f"{jobs_url}/mcp", "prefix": "job_", "labels": {"sleep": "bounded"}},
            {
                "name": "payments",
                "url": f"{payments_url}/mcp",
                "prefix": "pay_",
                "labels": {"sleep": "irreversible"},
            },
        ]
        data["identities"][1]["lease"] = "optional"  # billing-bot has no runs
        async with running_gateway(data) as (app, gateway_url):
            upstreams = {"reads": reads, "jobs": jobs, "payments": payments}
            yield Stack(control_url, app, gateway_url, upstreams, db)


async def sleep(client: Client, tool: str, seconds: float, lease: str | None) -> CallToolResult:
    meta = {LEASE_META: lease} if lease else None
    return await client.call_tool(tool, {"seconds": seconds}, meta=meta)  # type: ignore[arg-type]


async def in_flight(upstreams: list[DemoUpstream], within: float = 10.0) -> None:
    """Return once each of ``upstreams`` is running a call."""
    with anyio.fail_after(within):
        while any(u.in_flight < 1 for u in upstreams):
            await anyio.sleep(0.02)


async def stop(control_url: str, scope: str) -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=control_url, timeout=10) as http:
        r = await http.post("/v1/stops", json={"scope": scope, "reason": "refund storm"}, headers=OPERATOR)
    assert r.status_code == 201, r.text
    issued: dict[str, Any] = r.json()
    return issued


async def reported_calls(
    control_url: str, run_id: str, count: int, within: float = 15.0
) -> list[dict[str, Any]]:
    """The run report's ``calls`` once it lists ``count`` of them (the gateway reports them
    after the fact, best effort)."""
    async with httpx2.AsyncClient(base_url=control_url, timeout=10) as http:
        with anyio.fail_after(within):
            while True:
                r = await http.get(f"/v1/runs/{run_id}/report", headers=OPERATOR)
                assert r.status_code == 200, r.text
                calls: list[dict[str, Any]] = r.json()["calls"]
                if len(calls) >= count:
                    return calls
                await anyio.sleep(0.1)


def error_of(result: CallToolResult) -> dict[str, Any] | None:
    if not result.is_error:
        return None
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error


@pytest.mark.parametrize("path", PATHS)
async def test_an_agent_stop_cuts_the_cancellable_call_in_flight_and_lets_the_others_finish(
    tmp_path: Path, path: str
) -> None:
    """The defect: a 4 s call started 1 s before an ``agent:`` stop finished and returned its
    result; the stop reached only the calls made after it."""
    async with (
        stack(tmp_path) as s,
        ControlClient(s.control_url, CONTROL_TOKENS["ops-bot"]) as control,
        Lease.start(control, push=False) as lease,
        connect(s.gateway_url, TOKENS["ops-bot"], mode=PATHS[path]) as ops,
        connect(s.gateway_url, TOKENS["billing-bot"], mode=PATHS[path]) as billing,
    ):
        results: dict[str, CallToolResult] = {}
        answered_at: dict[str, float] = {}

        async def call(name: str, client: Client, tool: str, seconds: float, token: str | None) -> None:
            results[name] = await sleep(client, tool, seconds, token)
            answered_at[name] = anyio.current_time()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "read", ops, "read_sleep", LONG_S, lease.token)
            tg.start_soon(call, "job", ops, "job_sleep", SHORT_S, lease.token)
            tg.start_soon(call, "pay", ops, "pay_sleep", SHORT_S, lease.token)
            await in_flight(list(s.upstreams.values()))
            # Another agent's call to the same cancellable tool: the stop is not its scope.
            tg.start_soon(call, "other", billing, "read_sleep", SHORT_S, None)
            with anyio.fail_after(10):
                while s.upstreams["reads"].in_flight < 2:
                    await anyio.sleep(0.02)
            issued = await stop(s.control_url, "agent:ops-bot")
            stopped_at = anyio.current_time()

        # The cancellable call: cut, and the agent told so, long before it would have ended.
        error = error_of(results["read"])
        assert error is not None, "the cancellable call in flight finished despite the stop"
        assert error["code"] == "stopped", error
        assert (error["stop_id"], error["scope"]) == (issued["stop_id"], "agent:ops-bot")
        assert answered_at["read"] - stopped_at < LONG_S / 3
        reads = s.upstreams["reads"]
        with anyio.fail_after(5):
            while reads.cancelled["sleep"] < 1:  # the upstream saw its request cancelled
                await anyio.sleep(0.02)
        # The bounded and the irreversible calls finished with their results; neither was cut.
        for name, upstream in (("job", "jobs"), ("pay", "payments")):
            assert error_of(results[name]) is None, (name, results[name])
            assert s.upstreams[upstream].served["sleep"] == 1 and not s.upstreams[upstream].cancelled
        # billing-bot's call is in no scope of the stop: untouched.
        assert error_of(results["other"]) is None and reads.served["sleep"] == 1
        # The next call of the stopped agent is refused before it starts.
        assert (error_of(await sleep(ops, "read_sleep", 0.01, lease.token)) or {}).get("code") == "stopped"

        calls = await reported_calls(s.control_url, lease.run_id, 3)
    by_tool = {c["tool"]: c for c in calls}
    assert sorted(by_tool) == ["job_sleep", "pay_sleep", "read_sleep"] and len(calls) == 3
    expected = {
        "read_sleep": ("cancellable", "cancelled"),
        "job_sleep": ("bounded", "completed"),
        "pay_sleep": ("irreversible", "completed"),
    }
    for tool, (label, outcome) in expected.items():
        c = by_tool[tool]
        assert (c["label"], c["outcome"], c["stop_id"]) == (label, outcome, issued["stop_id"]), c
        assert c["started_at"] <= c["stopped_at"] <= c["ended_at"], c


async def test_the_cancellation_never_waits_for_the_report_which_is_retried(tmp_path: Path) -> None:
    """The control plane refuses to record the outcome (its audit log fails for it): the agent
    is answered ``stopped`` at once all the same, and the outcome is recorded once it can be."""
    async with (
        stack(tmp_path) as s,
        ControlClient(s.control_url, CONTROL_TOKENS["ops-bot"]) as control,
        Lease.start(control, push=False) as lease,
        connect(s.gateway_url, TOKENS["ops-bot"]) as ops,
    ):
        sql = raw_sql({"backend": "sqlite", "path": str(s.db)})
        # Only the gateway's records fail: the stop itself is written and pushed as always.
        sql(
            "CREATE TRIGGER no_calls BEFORE INSERT ON audit WHEN NEW.action LIKE 'call.%' "
            "BEGIN SELECT RAISE(ABORT, 'the audit disk is full'); END"
        )
        result: list[CallToolResult] = []

        async def call() -> None:
            result.append(await sleep(ops, "read_sleep", LONG_S, lease.token))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await in_flight([s.upstreams["reads"]])
            issued = await stop(s.control_url, f"run:{lease.run_id}")
            stopped_at = anyio.current_time()
        assert (error_of(result[0]) or {}).get("code") == "stopped"
        assert anyio.current_time() - stopped_at < LONG_S / 3
        await anyio.sleep(1.0)  # a report attempt or two fail meanwhile
        assert await reported_calls(s.control_url, lease.run_id, 0) == []
        sql("DROP TRIGGER no_calls")
        calls = await reported_calls(s.control_url, lease.run_id, 1)
    assert [(c["tool"], c["outcome"], c["stop_id"]) for c in calls] == [
        ("read_sleep", "cancelled", issued["stop_id"])
    ]


async def test_a_stdio_upstream_is_sent_notifications_cancelled(tmp_path: Path) -> None:
    """On stdio (and handshake-era HTTP) the cut reaches the upstream as the SDK client's
    ``notifications/cancelled``: the upstream's own handler is cancelled."""
    journal = tmp_path / "journal"
    journal.touch()
    upstream = {
        "name": "local",
        "command": [sys.executable, str(Path(__file__).parent / "stdio_journal_upstream.py"), str(journal)],
        "prefix": "local_",
        "labels": {"sleep": "cancellable"},
    }
    async with running_control_plane(tmp_path / "control.db") as control_url:
        link = {"url": control_url, "token": CONTROL_TOKENS["gateway"], "staleness_s": 5.0}
        data = demo_config("http://127.0.0.1:9", control=link, leases={"keys": LEASE_KEYS})
        data["upstreams"] = [upstream]
        async with (
            running_gateway(data) as (app, gateway_url),
            ControlClient(control_url, CONTROL_TOKENS["ops-bot"]) as control,
            Lease.start(control, push=False) as lease,
            connect(gateway_url, TOKENS["ops-bot"]) as ops,
        ):
            result: list[CallToolResult] = []

            async def call() -> None:
                result.append(await sleep(ops, "local_sleep", LONG_S, lease.token))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                inflight = app.gateway.inflight
                assert inflight is not None
                with anyio.fail_after(10):
                    while len(inflight) < 1:  # the call is on its way upstream
                        await anyio.sleep(0.02)
                await anyio.sleep(0.5)  # and at the upstream (it would take LONG_S)
                issued = await stop(control_url, "agent:ops-bot")
            assert (error_of(result[0]) or {}).get("stop_id") == issued["stop_id"]
            with anyio.fail_after(5):
                while "cancelled" not in journal.read_text():
                    await anyio.sleep(0.02)
            calls = await reported_calls(control_url, lease.run_id, 1)
    assert journal.read_text().split() == ["cancelled"]
    assert [(c["tool"], c["label"], c["outcome"]) for c in calls] == [
        ("local_sleep", "cancellable", "cancelled")
    ]


async def test_each_label_gets_its_treatment_and_a_stop_before_the_upstream_refuses_the_call() -> None:
    """The policy table on its own: a stop applied while calls of each label are registered
    (``StopWatch.apply``, as the stream does), and one applied before a call reached its upstream
    (while it was admitted: the gap between the pipeline's stop check and the upstream)."""
    watch = StopWatch(ControlLink(url="http://127.0.0.1:9", token="t"))
    inflight = InFlight(watch, None)
    ops, billing = Identity("ops-bot", "acme", "1.0"), Identity("billing-bot", "acme", "2.0")
    calls = {
        label: inflight.start(ops, f"tool_{label}", label, None)
        for label in ("cancellable", "bounded", "irreversible")
    }
    other = inflight.start(billing, "tool_cancellable", "cancellable", None)
    assert isinstance(other, Call) and all(isinstance(c, Call) for c in calls.values())
    stop = {"stop_id": "stp_1", "scope": "agent:ops-bot", "reason": "loops", "issued_by": "oncall"}
    watch.apply("stop", {"revision": 1, "stop": {**stop, "issued_at": 0, "expires_at": None, "revision": 1}})
    cut = {label: c.scope.cancel_called for label, c in calls.items() if isinstance(c, Call)}
    assert cut == {"cancellable": True, "bounded": False, "irreversible": False}
    assert all(isinstance(c, Call) and c.stop_id == "stp_1" for c in calls.values())
    assert not other.scope.cancel_called and other.stop_id is None, "not in the stop's scope"
    late = inflight.start(ops, "tool_bounded", "bounded", None)
    assert isinstance(late, Refusal) and late.code == "stopped" and len(inflight) == 4
