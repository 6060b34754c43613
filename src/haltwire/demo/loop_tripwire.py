"""Scenario 8 of ``haltwire demo loop``: a repetition tripwire stops the looping agent.

The seed's agent sends the same call (same tool, same arguments) again and again. Under a
budget of 50 alone it is stopped at call 51, after 50 calls that did nothing new; with a
``repeated_calls`` tripwire of 5 in a row (enforce mode) beside the same budget, the gateway
refuses its fifth identical call ``tripwire_tripped``, naming the rule, and the agent stops
there. The rule counts within a run, so the agent calls under a lease, signed here as the
control plane signs one; with no control plane, the gateway itself keeps refusing the run.
"""

from __future__ import annotations

import time
from typing import Any, Final

from haltwire.demo.agent import AgentLog, run_agent
from haltwire.demo.loop_results import Row, ScenarioResult, observe, upstream_counts, upstream_note
from haltwire.demo.loop_scenarios import STEPS
from haltwire.demo.stack import LEASE_KEYS, TOKENS, connect, demo_config, running_gateway, running_upstream
from haltwire.meta import LEASE_META
from haltwire.tokens import LeaseClaims, LeaseKeys

RULE: Final = "same-call-5"
BUDGET: Final = 50
IN_A_ROW: Final = 5


def lease_meta(run: str) -> dict[str, Any]:
    """``_meta`` with a lease for ops-bot's ``run``, signed with the demo's lease key."""
    key = LEASE_KEYS[0]
    keys = LeaseKeys({key["kid"]: key["secret"].encode()}, signing=key["kid"])
    now = time.time()
    return {LEASE_META: keys.sign(LeaseClaims(run, "ops-bot", "acme", "1.0", 0, now, now + 600))}


async def _loop(upstream_url: str, run: str, tripwires: list[dict[str, Any]]) -> AgentLog:
    config = demo_config(
        upstream_url, limits={"budget": BUDGET}, leases={"keys": LEASE_KEYS}, tripwires=tripwires
    )
    async with running_gateway(config) as (_, gw), connect(gw, TOKENS["ops-bot"]) as client:
        return await run_agent(client, "ops-bot", max_steps=STEPS, meta=lease_meta(run))


async def scenario_repeated_calls() -> ScenarioResult:
    r = ScenarioResult(
        8,
        f"the same call again and again: a budget of {BUDGET}, then a repeated_calls tripwire of {IN_A_ROW}",
    )
    rule = {"name": RULE, "kind": "repeated_calls", "in_a_row": IN_A_ROW, "mode": "enforce"}
    async with running_upstream() as (alone, url):
        budget_only = await _loop(url, "run-budget-only", [])
    async with running_upstream() as (demo, url):
        tripped = await _loop(url, "run-loop", [rule])
    r.rows.append(Row.of(budget_only, f"ops-bot, budget of {BUDGET} only"))
    r.rows.append(Row.of(tripped, f"ops-bot, + {RULE}"))
    r.logs.extend(log.to_dict() for log in (budget_only, tripped))
    last = tripped.last
    if last is not None:
        r.notes.append(f'with the tripwire, the model reads: "{last.text}"')
    r.notes.append(
        f"budget only: {budget_only.calls} calls, {budget_only.served} served for nothing new; "
        f"with the tripwire: {tripped.calls} calls, {BUDGET - tripped.served} of the budget left"
    )
    r.notes.append(f"with the tripwire: {upstream_note(demo)}")
    r.observed = {
        **observe("budget-only", budget_only),
        "budget-only.upstream.served": sum(alone.served.values()),
        **observe("ops-bot", tripped),
        "ops-bot.last.names_rule": last is not None and f"Tripwire {RULE} stopped run run-loop" in last.text,
        **upstream_counts(demo),
    }
    r.expected = {
        "budget-only.calls": BUDGET + 1,
        "budget-only.served": BUDGET,
        "budget-only.last.code": "budget_exhausted",
        "budget-only.upstream.served": BUDGET,
        "ops-bot.calls": IN_A_ROW,
        "ops-bot.served": IN_A_ROW - 1,
        "ops-bot.refused": 1,
        "ops-bot.stopped_by": "the server",
        "ops-bot.last.code": "tripwire_tripped",
        "ops-bot.last.retryable": False,
        "ops-bot.last.names_rule": True,
        "upstream.served": IN_A_ROW - 1,
        "upstream.refused": 0,
    }
    return r
