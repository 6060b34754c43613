"""Out of band: stops are issued, pushed and enforced while the counters store is down and the gateway is saturated.

The stop path (control plane, its SQLite registry, the gateway's watch stream, the stop
check at the head of the gateway's pipeline) shares nothing with the counting path (the
ceilings and their Redis). So killing Redis in the middle of a load that fills every
in-flight cap must not slow the control plane, delay a push, or turn a stopped agent's
refusal into ``counters_unavailable``. Everything is real: a private ``redis-server``
killed with SIGKILL and restarted on its port, the control plane, the demo upstream, the
gateway, and the official MCP client in many concurrent sessions.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from control_harness import Events, auth
from haltwire.demo.upstream import DemoUpstream
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from redis_process import RedisProcess, unique_prefix
from stops_harness import control_plane, until

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

AGENTS = ("ops-bot", "billing-bot", "edge-bot")
STOPPED, UNSTOPPED = "ops-bot", "billing-bot"
SESSIONS_PER_AGENT = 2
#: Per session: tasks calling the slow tool (they fill its in-flight cap) and tasks hammering.
SLOW_TASKS, FAST_TASKS = 3, 3
SLOW_S = 0.3
#: Between one caller's calls. Client, gateway, upstream and control plane share one event loop
#: (and two busy cores): callers spinning on instant refusals would starve all of them alike,
#: which would test the machine, not the separation of the stop path from the counters.
PAUSE_S = 0.02
SLEEP_CAP = 2
#: Far above the control plane's heartbeat (0.2 s): one event loop runs everything here under
#: load on two shared cores, and a late heartbeat must not read as a lost control plane.
STALENESS_S = 5.0
#: Generous: what is measured is "not stuck behind the dead Redis", not speed.
POST_WITHIN_S = 2.0
DOWN = "counters_unavailable"


def gateway_config(upstream: str, control: str, redis_url: str) -> dict[str, Any]:
    identities = [
        {"agent": "ops-bot", "tenant": "acme", "version": "1.0", "token": TOKENS["ops-bot"]},
        {"agent": "billing-bot", "tenant": "acme", "version": "2.0", "token": TOKENS["billing-bot"]},
        {"agent": "edge-bot", "tenant": "edge", "version": "1.0", "token": TOKENS["edge-bot"]},
    ]
    return config_dict(
        upstream,
        control={"url": control, "token": "tok-gateway", "staleness_s": STALENESS_S},
        counters={
            "backend": "redis",
            "url": redis_url,
            "prefix": unique_prefix("hwtest-oob"),
            # Generous while Redis is up (a loaded loop must not refuse for slowness); a dead
            # Redis refuses the connection at once anyway.
            "timeout_s": 2.0,
        },
        limits={
            "budget": 1_000_000,
            "max_in_flight": 8,
            "tools": {"sleep": {"max_in_flight": SLEEP_CAP}},
        },
        identities=identities,
    )


@dataclass(frozen=True)
class Outcome:
    agent: str
    tool: str
    started: float
    finished: float
    #: "ok", a refusal code, or "exception:TYPE".
    code: str
    error: dict[str, Any] = field(default_factory=dict)


async def call(client: Client, tool: str, agent: str = "") -> Outcome:
    args: dict[str, Any] = {"seconds": SLOW_S} if tool == "sleep" else {"order_id": "A-1"}
    started = time.monotonic()
    try:
        result = await client.call_tool(tool, args)
    except Exception as exc:  # recorded, and asserted absent: a crash is not a refusal
        return Outcome(agent, tool, started, time.monotonic(), f"exception:{type(exc).__name__}")
    error: dict[str, Any] = (result.structured_content or {}).get("error") or {} if result.is_error else {}
    code = "ok" if not result.is_error else str(error.get("code", "no-code"))
    return Outcome(agent, tool, started, time.monotonic(), code, error)


async def until_answered(
    client: Client, tool: str, code: str, stop_id: str | None = None, within: float = 5.0
) -> None:
    """Call ``tool`` until it is answered ``code`` (and ``stop_id``); fails with the last answer."""
    last = None
    try:
        with anyio.fail_after(within):
            while True:
                last = await call(client, tool)
                if last.code == code and last.error.get("stop_id") == stop_id:
                    return
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(
            f"{tool} was not answered {code} {stop_id or ''} within {within} s; last: {last}"
        ) from None


class Load:
    """Many concurrent callers over a few MCP sessions per agent, for as long as the test runs."""

    def __init__(self) -> None:
        self.log: list[Outcome] = []

    async def caller(self, client: Client, agent: str, tool: str) -> None:
        while True:
            self.log.append(await call(client, tool, agent))
            # Let other tasks in when refusals come back at once (a dead Redis refuses fast).
            await anyio.sleep(PAUSE_S)

    def start(self, tg: anyio.abc.TaskGroup, sessions: dict[str, list[Client]]) -> None:
        for agent, clients in sessions.items():
            for client in clients:
                for _ in range(SLOW_TASKS):
                    tg.start_soon(self.caller, client, agent, "sleep")
                for _ in range(FAST_TASKS):
                    tg.start_soon(self.caller, client, agent, "lookup_order")

    def between(self, t0: float, t1: float) -> list[Outcome]:
        """Calls both started and finished within [t0, t1]."""
        return [o for o in self.log if o.started >= t0 and o.finished <= t1]


@asynccontextmanager
async def watching(url: str) -> AsyncIterator[Events]:
    """An operator's own watch on the control plane, separate from the gateway's."""
    async with (
        httpx2.AsyncClient(base_url=url, timeout=httpx2.Timeout(10.0, read=30.0)) as http,
        http.stream("GET", "/v1/watch?since=0", headers=auth("viewer")) as resp,
    ):
        assert resp.status_code == 200
        yield Events(resp)


async def timed_post(
    http: httpx2.AsyncClient, path: str, body: dict[str, str], status: int
) -> dict[str, Any]:
    began = time.monotonic()
    r = await http.post(path, json=body, headers=auth("operator"))
    took = time.monotonic() - began
    assert r.status_code == status, r.text
    assert took < POST_WITHIN_S, f"POST {path} took {took:.2f} s while Redis was down"
    out: dict[str, Any] = r.json()
    return out


async def outage(
    redis_server: RedisProcess,
    demo: DemoUpstream,
    http: httpx2.AsyncClient,
    events: Events,
    load: Load,
    stopped: Client,
    unstopped: Client,
) -> None:
    """Saturate, kill Redis, stop and clear through the control plane, restart Redis."""

    # Saturated: the slow tool's cap is full and refusing, and calls are being served.
    async def saturated() -> bool:
        codes = Counter(o.code for o in load.log)
        return codes["too_many_in_flight"] >= 5 and codes["ok"] >= 20

    await until(saturated, within=20.0)
    assert demo.max_in_flight >= SLEEP_CAP

    await anyio.to_thread.run_sync(redis_server.stop)  # SIGKILL
    killed_at = time.monotonic()

    await until_answered(unstopped, "lookup_order", DOWN)

    # (1) The control plane takes each change at once and pushes it, Redis or not;
    # (2) the gateway enforces it with its counters store still down. The stop check
    # comes before the ceilings, so a stopped call is refused ``stopped``, not
    # ``counters_unavailable``; an unstopped one is refused by the dead store.
    agent_stop = await timed_post(http, "/v1/stops", {"scope": f"agent:{STOPPED}", "reason": "runaway"}, 201)
    tool_stop = await timed_post(http, "/v1/stops", {"scope": "tool:sleep", "reason": "slow"}, 201)
    pushed = [await events.next_change(within=5.0) for _ in range(2)]
    assert [(e["event"], json.loads(e["data"])["stop"]["stop_id"]) for e in pushed] == [
        ("stop", agent_stop["stop_id"]),
        ("stop", tool_stop["stop_id"]),
    ]

    # Changes are applied in order: once the tool stop holds, the agent stop does too.
    await until_answered(unstopped, "sleep", "stopped", tool_stop["stop_id"])
    for client, tool, code, stop_id in (
        (stopped, "lookup_order", "stopped", agent_stop["stop_id"]),
        (stopped, "sleep", "stopped", agent_stop["stop_id"]),
        (unstopped, "lookup_order", DOWN, None),
    ):
        o = await call(client, tool)
        assert (o.code, o.error.get("stop_id")) == (code, stop_id), o

    await timed_post(http, f"/v1/stops/{tool_stop['stop_id']}/clear", {"reason": "ok"}, 200)
    event = await events.next_change(within=5.0)
    assert (event["event"], json.loads(event["data"])["stop"]["stop_id"]) == (
        "clear",
        tool_stop["stop_id"],
    )

    await until_answered(unstopped, "sleep", DOWN)
    for tool in ("lookup_order", "sleep"):
        o = await call(stopped, tool)
        assert (o.code, o.error.get("stop_id"), o.error.get("retryable")) == (
            "stopped",
            agent_stop["stop_id"],
            False,
        ), o
        o = await call(unstopped, tool)
        assert (o.code, o.error.get("retryable")) == (DOWN, True), o
    assert not redis_server.running

    # The load kept running through the outage and got the same answers.
    window_end = time.monotonic()
    during = load.between(killed_at, window_end)
    assert len(during) > 50, f"only {len(during)} load calls during the outage"
    assert not [o for o in during if o.code.startswith("exception:")], "a call failed, not refused"
    assert not [o for o in during if o.code == "ok"], "nothing is admitted without counters"
    by_agent = {a: Counter(o.code for o in during if o.agent == a) for a in AGENTS}
    assert by_agent[STOPPED]["stopped"] > 0, by_agent
    assert set(by_agent[STOPPED]) <= {DOWN, "stopped"}, by_agent
    for agent in (UNSTOPPED, "edge-bot"):
        assert by_agent[agent][DOWN] > 0, by_agent
        # tool:sleep was stopped for a moment and cleared: only those two codes.
        assert set(by_agent[agent]) <= {DOWN, "stopped"}, by_agent
    # After the gateway has applied the agent stop, the stopped agent is never refused
    # by the counters: the stop check comes first.
    applied = min(o.finished for o in load.log if o.agent == STOPPED and o.code == "stopped")
    later = [o for o in load.between(applied, window_end) if o.agent == STOPPED]
    assert all(o.code == "stopped" for o in later), Counter(o.code for o in later)

    # Redis returns on its port: the unstopped agent is served again, the stopped one is not.
    await anyio.to_thread.run_sync(redis_server.start)
    restarted_at = time.monotonic()

    await until_answered(unstopped, "lookup_order", "ok", within=10.0)
    o = await call(stopped, "lookup_order")
    assert (o.code, o.error.get("stop_id")) == ("stopped", agent_stop["stop_id"]), o

    async def load_served_again() -> bool:
        after = load.between(restarted_at, time.monotonic())
        return any(o.code == "ok" and o.agent == "edge-bot" for o in after)

    await until(load_served_again, within=10.0)
    after = load.between(restarted_at, time.monotonic())
    assert not [o for o in after if o.agent == STOPPED and o.code != "stopped"], "a stop held"
    assert not [o for o in load.log if o.code.startswith("exception:")]


async def test_stops_are_issued_pushed_and_enforced_while_redis_is_down_under_load(tmp_path: Path) -> None:
    redis_server = RedisProcess(tmp_path)
    redis_server.start()  # skips (or fails under HALTWIRE_REQUIRE_SERVICES=1) without redis-server
    load = Load()
    failure: Exception | None = None
    try:
        async with (
            control_plane(tmp_path / "control.db") as cp,
            running_upstream() as (demo, up),
            running_gateway(gateway_config(up, cp, redis_server.url)) as (_, url),
            httpx2.AsyncClient(base_url=cp, timeout=10) as http,
            watching(cp) as events,
            AsyncExitStack() as stack,
        ):
            sessions = {
                agent: [
                    await stack.enter_async_context(connect(url, TOKENS[agent]))
                    for _ in range(SESSIONS_PER_AGENT)
                ]
                for agent in AGENTS
            }
            # Probes on sessions of their own, beside the load.
            stopped = await stack.enter_async_context(connect(url, TOKENS[STOPPED]))
            unstopped = await stack.enter_async_context(connect(url, TOKENS[UNSTOPPED]))
            # Every session is open before the task group and closes after it.
            async with anyio.create_task_group() as tg:
                load.start(tg, sessions)
                try:
                    await outage(redis_server, demo, http, events, load, stopped, unstopped)
                except Exception as exc:
                    # Raised below, once everything has shut down: raised here it would come out
                    # wrapped in a dozen exception groups, one per MCP session it passes through.
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
    finally:
        redis_server.stop()
    if failure is not None:
        raise failure
