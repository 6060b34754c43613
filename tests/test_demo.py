"""``haltwire demo loop``: the scripted agent's policy, and each scenario's numbers from the seed."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import CallToolResult

from haltwire import refusal
from haltwire.demo import loop, loop_control_plane, loop_scenarios, loop_tripwire
from haltwire.demo.agent import Answer, decide, read_answer
from haltwire.demo.loop_results import ScenarioResult


def result(wire: dict[str, Any]) -> CallToolResult:
    return CallToolResult.model_validate(wire)


def text_error(text: str) -> CallToolResult:
    return result({"isError": True, "content": [{"type": "text", "text": text}]})


# The agent's decision: the data decides first, then the words.


def test_a_result_that_is_not_an_error_is_served() -> None:
    answer = read_answer(
        result({"content": [{"type": "text", "text": "order A-1: shipped"}], "structuredContent": {"x": 1}})
    )
    assert answer == Answer(is_error=False, text="order A-1: shipped")
    assert decide(answer).action == "served"


@pytest.mark.parametrize(
    "r",
    [
        refusal.budget_exhausted("ops-bot", 20, 3600.0),
        refusal.agent_suspended("ops-bot"),
        refusal.deadline_exceeded("lookup_order", 30),
    ],
)
def test_a_terminal_refusal_stops_the_agent(r: refusal.Refusal) -> None:
    answer = read_answer(result(r.tool_result()))
    assert (answer.code, answer.retryable) == (r.code, False)
    assert decide(answer).action == "stop"


def test_terminal_data_wins_over_words_that_say_try_again() -> None:
    wire = refusal.Refusal("budget_exhausted", "Please try again.", retryable=False).tool_result()
    assert decide(read_answer(result(wire))).action == "stop"


def test_a_retryable_refusal_is_retried_after_what_it_says() -> None:
    answer = read_answer(result(refusal.too_many_in_flight("ops-bot", 2, retry_after_s=1.0).tool_result()))
    decision = decide(answer)
    assert (decision.action, decision.wait_s) == ("retry", 1.0)
    assert answer.describe() == "too_many_in_flight, retryable true, retry after 1s"


def test_the_please_try_again_refusal_is_retried() -> None:
    answer = read_answer(result(refusal.please_try_again().tool_result()))
    assert decide(answer).action == "retry"
    assert answer.describe() == 'rate_limited, retryable true: "Rate limited. Please try again."'


@pytest.mark.parametrize(
    "text",
    [
        "Rate limited. Please try again.",
        "Upstream refused: 429 quota exceeded for this API key. Try again later.",
        "Busy; retry in a moment.",
    ],
)
def test_error_text_that_says_try_again_is_retried(text: str) -> None:
    answer = read_answer(text_error(text))
    assert (answer.code, answer.retryable) == (None, None)
    decision = decide(answer)
    assert decision.action == "retry"
    assert decision.wait_s > 0


@pytest.mark.parametrize("text", ["the demo tool failed", "Order not found.", "Entry again later."])
def test_error_text_without_retry_wording_stops_the_agent(text: str) -> None:
    assert decide(read_answer(text_error(text))).action == "stop"


def test_a_structured_error_without_a_retryable_flag_falls_back_to_the_words() -> None:
    wire = {
        "isError": True,
        "content": [{"type": "text", "text": "Try again later."}],
        "structuredContent": {"error": {"code": "x", "retryable": "yes"}},
    }
    answer = read_answer(result(wire))
    assert answer.retryable is None
    assert decide(answer).action == "retry"


# The scenarios, run for real on loopback (each starts its own upstream and gateway).


def _check(r: ScenarioResult) -> ScenarioResult:
    assert r.error is None, r.error
    assert r.deviations == [], r.deviations
    return r


@pytest.mark.anyio
async def test_1_a_terminal_refusal_stops_the_agent_at_call_21() -> None:
    r = _check(await loop_scenarios.scenario_terminal_budget())
    o = r.observed
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (21, 20, 1)
    assert o["ops-bot.stopped_by"] == "the server"
    assert (o["ops-bot.last.code"], o["ops-bot.last.retryable"]) == ("budget_exhausted", False)
    assert (o["upstream.served"], o["upstream.refused"]) == (20, 0)


@pytest.mark.anyio
async def test_2_please_try_again_runs_the_agent_to_its_own_cap() -> None:
    r = _check(await loop_scenarios.scenario_please_try_again())
    o = r.observed
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (200, 20, 180)
    assert o["ops-bot.stopped_by"] == "its own 200-step cap"
    assert o["ops-bot.last.text"] == "Rate limited. Please try again."
    assert o["upstream.served"] == 20


@pytest.mark.anyio
async def test_3_the_upstream_quota_is_shared_by_everyone_on_the_key() -> None:
    r = _check(await loop_scenarios.scenario_upstream_quota())
    o = r.observed
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (200, 50, 150)
    assert o["ops-bot.stopped_by"] == "its own 200-step cap"
    assert o["ops-bot.last.text"] == loop_scenarios.QUOTA_TEXT
    assert o["billing-bot.first.is_error"] is True
    assert o["billing-bot.first.text"] == loop_scenarios.QUOTA_TEXT
    assert o["upstream.served"] == 50


@pytest.mark.anyio
async def test_4_two_in_flight_of_a_burst_of_five() -> None:
    r = _check(await loop_scenarios.scenario_in_flight())
    o = r.observed
    assert (o["ops-bot.served"], o["ops-bot.refused"]) == (2, 3)
    assert o["ops-bot.refused.codes"] == ["too_many_in_flight"]
    assert o["ops-bot.refused.retryable"] == [True]
    assert o["ops-bot.refused.retry_after_s"] == [1.0]
    assert (o["upstream.held_at_once"], o["upstream.served"], o["upstream.refused"]) == (2, 2, 0)


@pytest.mark.anyio
async def test_5_the_kill_switch_stops_the_sixth_call_and_lifts_on_the_same_connection() -> None:
    r = _check(await loop_scenarios.scenario_kill_switch())
    o = r.observed
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (6, 5, 1)
    assert o["ops-bot.stopped_by"] == "the server"
    assert (o["ops-bot.last.code"], o["ops-bot.last.retryable"]) == ("agent_suspended", False)
    assert o["ops-bot.after_clear.served"] is True
    assert o["upstream.served"] == 6


@pytest.mark.anyio
async def test_6_a_refusal_at_the_http_gate_makes_the_client_raise_after_one_attempt() -> None:
    r = _check(await loop_scenarios.scenario_http_gate())
    o = r.observed
    assert o["ops-bot.last.code"] == "budget_exhausted"
    assert (o["edge-bot.calls"], o["edge-bot.served"], o["edge-bot.raised"]) == (6, 5, "MCPError")
    assert o["edge-bot.http_errors"] == [429]
    assert (o["edge-bot.suspended.raised"], o["edge-bot.suspended.http_errors"]) == ("MCPError", [403])


@pytest.mark.anyio
async def test_7_a_control_plane_stop_refuses_the_run_ends_its_lease_and_fences_it_after_the_clear() -> None:
    r = _check(await loop_control_plane.scenario_control_plane_stop())
    o = r.observed
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (6, 5, 1)
    assert (o["ops-bot.last.code"], o["ops-bot.last.retryable"]) == ("stopped", False)
    assert o["ops-bot.lease.ended_by"] is not None and o["ops-bot.lease.ended_by"].startswith("stp_")
    assert o["ops-bot.after_clear.old_lease"] == "lease_invalid"
    assert o["ops-bot.after_clear.new_run.served"] is True
    assert o["upstream.served"] == 6


@pytest.mark.anyio
async def test_8_a_repeated_calls_tripwire_stops_the_looping_agent_at_call_5_long_before_its_budget() -> None:
    r = _check(await loop_tripwire.scenario_repeated_calls())
    o = r.observed
    # The budget alone lets the same call through 50 times.
    assert (o["budget-only.calls"], o["budget-only.served"]) == (51, 50)
    assert o["budget-only.last.code"] == "budget_exhausted"
    # With the tripwire: the fifth identical call is refused, naming the rule; the agent stops.
    assert (o["ops-bot.calls"], o["ops-bot.served"], o["ops-bot.refused"]) == (5, 4, 1)
    assert o["ops-bot.stopped_by"] == "the server"
    assert (o["ops-bot.last.code"], o["ops-bot.last.retryable"]) == ("tripwire_tripped", False)
    assert o["ops-bot.last.names_rule"] is True
    assert (o["upstream.served"], o["upstream.refused"]) == (4, 0)
    assert "same-call-5" in r.logs[1]["last"]["text"]


def test_a_deviation_names_the_number_that_differs() -> None:
    r = ScenarioResult(1, "t", expected={"ops-bot.calls": 21}, observed={"ops-bot.calls": 22})
    assert not r.ok
    assert r.deviations == ["ops-bot.calls: expected 21, got 22"]


def test_the_command_prints_the_report_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert loop.main(["--only", "1", "--only", "5"]) == 0
    out = capsys.readouterr().out
    assert "1. a budget of 20 calls an hour" in out
    assert "agent_suspended, retryable false" in out
    assert "all 2 scenarios behaved as expected" in out


def test_the_command_exits_1_and_names_the_scenario_that_deviated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def wrong() -> ScenarioResult:
        return ScenarioResult(4, "t", expected={"ops-bot.served": 2}, observed={"ops-bot.served": 3})

    monkeypatch.setitem(loop.SCENARIOS, 4, wrong)
    assert loop.main(["--only", "4", "--json"]) == 1
    captured = capsys.readouterr()
    assert '"ok": false' in captured.out
    assert "ops-bot.served: expected 2, got 3" in captured.out
    assert "scenario 4 deviated" in captured.err
