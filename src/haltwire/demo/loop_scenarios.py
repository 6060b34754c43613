"""Scenarios 1 to 6 of ``haltwire demo loop``: the gateway's own limits, with no control plane.

Each starts a demo upstream and a fresh gateway in this process, connects the scripted agent
(``haltwire.demo.agent``) with the official MCP client over HTTP, and returns what the agent
did and what the upstream served beside the numbers the seed reports.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio

from haltwire.demo.agent import Answer, call_once, run_agent
from haltwire.demo.loop_results import (
    Row,
    ScenarioResult,
    http_error_statuses,
    observe,
    upstream_counts,
    upstream_note,
)
from haltwire.demo.stack import TOKENS, connect, demo_config, running_gateway, running_upstream
from haltwire.gateway.killswitch import write_suspensions

QUOTA_TEXT: Final = "Upstream refused: 429 quota exceeded for this API key. Try again later."
TRY_AGAIN_TEXT: Final = "Rate limited. Please try again."
STEPS: Final = 200
BUDGET: Final = 20


@asynccontextmanager
async def _kill_switch() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="haltwire-demo-") as tmp:
        yield Path(tmp) / "suspended.json"


async def scenario_terminal_budget() -> ScenarioResult:
    r = ScenarioResult(1, f"a budget of {BUDGET} calls an hour, refused with a terminal error")
    async with (
        running_upstream() as (demo, url),
        running_gateway(demo_config(url, limits={"budget": BUDGET})) as (_, gw),
        connect(gw, TOKENS["ops-bot"]) as client,
    ):
        log = await run_agent(client, "ops-bot", max_steps=STEPS)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.notes.append(upstream_note(demo))
    r.observed = {**observe("ops-bot", log), **upstream_counts(demo)}
    r.expected = {
        "ops-bot.calls": BUDGET + 1,
        "ops-bot.served": BUDGET,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "budget_exhausted",
        "ops-bot.last.retryable": False,
        "upstream.served": BUDGET,
        "upstream.refused": 0,
    }
    return r


async def scenario_please_try_again() -> ScenarioResult:
    r = ScenarioResult(2, f'the same budget, refused with "{TRY_AGAIN_TEXT}"')
    async with running_upstream() as (demo, url):
        config = demo_config(
            url, limits={"budget": BUDGET}, gateway={"development": True, "refusal_style": "please-try-again"}
        )
        async with running_gateway(config) as (_, gw), connect(gw, TOKENS["ops-bot"]) as client:
            log = await run_agent(client, "ops-bot", max_steps=STEPS)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.notes.append(upstream_note(demo))
    r.notes.append(
        f"the budget held (the upstream served {BUDGET}); the words kept the agent calling, "
        f"{log.refused} refusals later"
    )
    r.observed = {**observe("ops-bot", log), **upstream_counts(demo)}
    r.observed["ops-bot.last.text"] = log.last.text if log.last else None
    r.expected = {
        "ops-bot.calls": STEPS,
        "ops-bot.served": BUDGET,
        "ops-bot.refused": STEPS - BUDGET,
        "ops-bot.stopped_by": f"its own {STEPS}-step cap",
        "ops-bot.last.text": TRY_AGAIN_TEXT,
        "upstream.served": BUDGET,
        "upstream.refused": 0,
    }
    return r


async def scenario_upstream_quota(quota: int = 50) -> ScenarioResult:
    r = ScenarioResult(3, f"no gateway budget, an upstream quota of {quota} calls for the shared key")
    async with (
        running_upstream(quota=quota) as (demo, url),
        running_gateway(demo_config(url)) as (_, gw),
    ):
        async with connect(gw, TOKENS["ops-bot"]) as client:
            log = await run_agent(client, "ops-bot", max_steps=STEPS)
        async with connect(gw, TOKENS["billing-bot"]) as client:
            first = await call_once(client)
    r.rows.append(Row.of(log))
    r.rows.append(
        Row(
            "billing-bot",
            1,
            0 if first.is_error else 1,
            1 if first.is_error else 0,
            "its single call",
            first.describe(),
        )
    )
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "billing-bot", "calls": 1, "first": first.to_dict()})
    verdict = "refused" if first.is_error else "served"
    r.notes.append(f"billing-bot's first call: {verdict}; it shares the key, so it shares the quota")
    r.notes.append(upstream_note(demo))
    r.observed = {
        **observe("ops-bot", log),
        "ops-bot.last.text": log.last.text if log.last else None,
        "billing-bot.first.is_error": first.is_error,
        "billing-bot.first.text": first.text,
        **upstream_counts(demo),
    }
    r.expected = {
        "ops-bot.calls": STEPS,
        "ops-bot.served": quota,
        "ops-bot.refused": STEPS - quota,
        "ops-bot.stopped_by": f"its own {STEPS}-step cap",
        "ops-bot.last.code": None,
        "ops-bot.last.text": QUOTA_TEXT,
        "billing-bot.first.is_error": True,
        "billing-bot.first.text": QUOTA_TEXT,
        "upstream.served": quota,
        "upstream.refused": STEPS - quota + 1,
    }
    return r


async def scenario_in_flight(cap: int = 2, burst: int = 5) -> ScenarioResult:
    r = ScenarioResult(4, f"at most {cap} calls in flight, {burst} sent at once")
    answers: list[Answer] = []
    async with (
        running_upstream() as (demo, url),
        running_gateway(demo_config(url, limits={"max_in_flight": cap})) as (_, gw),
        connect(gw, TOKENS["ops-bot"]) as client,
    ):

        async def one() -> None:
            answers.append(await call_once(client, "hold", {}))

        async with anyio.create_task_group() as tg:
            for _ in range(burst):
                tg.start_soon(one)
            # The upstream holds every admitted call, so no slot frees up until all calls of
            # the burst are either held there or answered with a refusal; then let them go.
            while len(answers) + demo.in_flight < burst:  # noqa: ASYNC110 - polls two counters
                await anyio.sleep(0.005)
            held = demo.in_flight
            demo.release()
    refused = [a for a in answers if a.is_error]
    served = len(answers) - len(refused)
    codes = sorted({a.code or "(none)" for a in refused})
    kinds = sorted({a.describe() for a in refused})
    r.rows.append(Row("ops-bot", burst, served, len(refused), f"a burst of {burst}", "; ".join(kinds)))
    r.logs.append({"agent": "ops-bot", "answers": [a.to_dict() for a in answers], "held_at_once": held})
    r.notes.append(f"{held} calls were held in the upstream at once when the burst was settled")
    r.notes.append(upstream_note(demo))
    r.observed = {
        "ops-bot.served": served,
        "ops-bot.refused": len(refused),
        "ops-bot.refused.codes": codes,
        "ops-bot.refused.retryable": sorted({a.retryable for a in refused}, key=str),
        "ops-bot.refused.retry_after_s": sorted({a.retry_after_s for a in refused}, key=str),
        "upstream.held_at_once": held,
        **upstream_counts(demo),
    }
    r.expected = {
        "ops-bot.served": cap,
        "ops-bot.refused": burst - cap,
        "ops-bot.refused.codes": ["too_many_in_flight"],
        "ops-bot.refused.retryable": [True],
        "ops-bot.refused.retry_after_s": [1.0],
        "upstream.held_at_once": cap,
        "upstream.served": cap,
        "upstream.refused": 0,
    }
    return r


async def scenario_kill_switch(before: int = 6) -> ScenarioResult:
    r = ScenarioResult(5, f"an operator suspends ops-bot before its {ordinal(before)} call")
    async with _kill_switch() as path, running_upstream() as (demo, url):
        config = demo_config(url, gateway={"development": True, "suspended_file": str(path)})
        async with running_gateway(config) as (_, gw), connect(gw, TOKENS["ops-bot"]) as client:

            async def operator(step: int) -> None:
                if step == before:
                    write_suspensions(path, ["ops-bot"])

            log = await run_agent(client, "ops-bot", max_steps=STEPS, before_call=operator)
            write_suspensions(path, [])
            after = await call_once(client)
    r.rows.append(Row.of(log))
    r.logs.append(log.to_dict())
    r.logs.append({"agent": "ops-bot", "after_clear": after.to_dict()})
    r.notes.append(f"switch cleared, same connection, next call: {'refused' if after.is_error else 'served'}")
    r.notes.append(upstream_note(demo))
    r.observed = {
        **observe("ops-bot", log),
        "ops-bot.after_clear.served": not after.is_error,
        **upstream_counts(demo),
    }
    r.expected = {
        "ops-bot.calls": before,
        "ops-bot.served": before - 1,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "agent_suspended",
        "ops-bot.last.retryable": False,
        "ops-bot.after_clear.served": True,
        "upstream.served": before,
        "upstream.refused": 0,
    }
    return r


async def scenario_http_gate(budget: int = 5) -> ScenarioResult:
    r = ScenarioResult(6, "the same refusals in the tool and at the HTTP gate (refuse_at = edge)")
    async with _kill_switch() as path, running_upstream() as (demo, url):
        config = demo_config(
            url, gateway={"development": True, "suspended_file": str(path)}, limits={"budget": budget}
        )
        config["identities"].append({"agent": "edge-bot", "token": TOKENS["edge-bot"], "refuse_at": "edge"})
        async with running_gateway(config) as (_, gw):
            async with connect(gw, TOKENS["ops-bot"]) as client:
                tool_log = await run_agent(client, "ops-bot", max_steps=STEPS)
            with http_error_statuses(gw) as budget_statuses:
                async with connect(gw, TOKENS["edge-bot"]) as client:
                    edge_log = await run_agent(client, "edge-bot", max_steps=STEPS)
            write_suspensions(path, ["edge-bot"])
            with http_error_statuses(gw) as suspended_statuses:
                async with connect(gw, TOKENS["edge-bot"]) as client:
                    suspended_log = await run_agent(client, "edge-bot", max_steps=STEPS)
    r.rows.append(Row.of(tool_log, "ops-bot (in the tool)"))
    r.rows.append(Row.of(edge_log, "edge-bot (at the gate)"))
    r.rows.append(Row.of(suspended_log, "edge-bot, suspended"))
    r.logs.extend(log.to_dict() for log in (tool_log, edge_log, suspended_log))
    if tool_log.last is not None:
        r.notes.append(f'in the tool, the model reads: "{tool_log.last.text}"')
    r.notes.append(
        f"at the gate, it reads nothing: HTTP {_statuses(budget_statuses)} over budget and "
        f"HTTP {_statuses(suspended_statuses)} suspended, each one attempt, then the client raised"
    )
    r.notes.append(upstream_note(demo))
    r.observed = {
        **observe("ops-bot", tool_log),
        "edge-bot.calls": edge_log.calls,
        "edge-bot.served": edge_log.served,
        "edge-bot.raised": (edge_log.raised or "").split(":")[0] or None,
        "edge-bot.http_errors": budget_statuses,
        "edge-bot.suspended.calls": suspended_log.calls,
        "edge-bot.suspended.raised": (suspended_log.raised or "").split(":")[0] or None,
        "edge-bot.suspended.http_errors": suspended_statuses,
        **upstream_counts(demo),
    }
    r.expected = {
        "ops-bot.calls": budget + 1,
        "ops-bot.served": budget,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "budget_exhausted",
        "ops-bot.last.retryable": False,
        "edge-bot.calls": budget + 1,
        "edge-bot.served": budget,
        "edge-bot.raised": "MCPError",
        "edge-bot.http_errors": [429],
        "edge-bot.suspended.calls": 1,
        "edge-bot.suspended.raised": "MCPError",
        "edge-bot.suspended.http_errors": [403],
        "upstream.served": 2 * budget,
        "upstream.refused": 0,
    }
    return r


def _statuses(statuses: list[int]) -> str:
    return ", ".join(str(s) for s in statuses) or "(none)"


def ordinal(n: int) -> str:
    """``6`` as ``"sixth"``, for the scenarios' titles."""
    words = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh"}
    return words.get(n, f"{n}th")
