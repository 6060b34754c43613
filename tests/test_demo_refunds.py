"""``haltwire demo refunds``: the seed's refund incident with real processes, capped at five refunds.

Each test runs the command as a user does (a subprocess that starts the control plane, the
shop, the gateway, the executor and on-call's webhook receiver as processes of their own) and
checks what it printed against the seed: five refunds applied by the shop per run, the sixth
refused at the gateway by the per-run tripwire, whose stop the tripwire identity wrote naming
the rule, the content rule's shadow firing recorded before the first refund, the run report
equal to the shop's own ledger, a page received for the run that matches its report, and the
gateway's call log replayed (``haltwire tripwires test``) firing the same rules at the same calls.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from haltwire.demo.refunds_stack import CONTENT_RULE, PAGER, RUN_RULE, TRIPWIRE
from haltwire.demo.shop import INJECTED_ORDER, ORDERS

pytestmark = pytest.mark.slow

#: The default run's repeated runs, and the soak's (``-m soak``): the issue's acceptance says 50.
SHORT_RUNS, SOAK_RUNS = 3, 50
#: The five orders refunded, and the sixth: the injected one and those read after it.
AFTER = list(ORDERS)[list(ORDERS).index(INJECTED_ORDER) :]


def demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwire", "demo", "refunds", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def replay(config: Path, log: Path) -> subprocess.CompletedProcess[str]:
    command = ["tripwires", "test", "--config", str(config), "--log", str(log), "--expect-same", "--json"]
    return subprocess.run(
        [sys.executable, "-m", "haltwire", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def rows(refunds: list[dict[str, Any]]) -> list[tuple[str, str, int, str]]:
    return sorted((r["idempotency_key"], r["order_id"], r["amount_cents"], r["refund_id"]) for r in refunds)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "count",
    [
        pytest.param(SHORT_RUNS, id=f"{SHORT_RUNS}-runs"),
        pytest.param(SOAK_RUNS, id=f"{SOAK_RUNS}-runs", marks=pytest.mark.soak),
    ],
)
def test_repeated_runs_are_each_capped_at_exactly_five_refunds_and_the_report_matches_the_shop(count: int) -> None:
    """``--runs N --json``: every run capped at five refunds, its report equal to the shop's
    ledger, its page and its replay as live. The default run repeats 3 runs on one stack; the
    soak variant (``-m soak``) is the issue's 50 runs."""
    done = demo("--runs", str(count), "--json", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    runs = out["runs"]
    assert out["ok"] and out["problems"] == []
    assert len(runs) == count and len({r["run_id"] for r in runs}) == count
    assert out["shop_applied_total"] == 5 * count, "no refund outside the runs' intents"
    for run in runs:
        name = f"run {run['run']} ({run['run_id']})"
        assert run["applied"] == 5, name
        # The report (control plane) and the ledger (the upstream) agree on every refund.
        assert rows(run["committed"]) == rows(run["ledger"]), name
        assert all(r["refund_id"] for r in run["committed"]), name
        assert [r["order_id"] for r in run["committed"]] == AFTER[:5], name
        stop, sixth, shadow, page = run["stop"], run["sixth"], run["shadow_firing"], run["page"]
        # The per-run tripwire: the sixth refund refused at the gateway, before any intent.
        assert (stop["scope"], stop["issued_by"]) == (f"run:{run['run_id']}", TRIPWIRE), name
        assert stop["reason"].startswith(f"tripwire {RUN_RULE} (steps, enforce): call 6 of run"), name
        assert sixth["order_id"] == AFTER[5], name
        refused = sixth["refused"]
        if refused["code"] == "stopped":  # the stop's push ended the agent's lease before the answer came
            assert refused["stop_id"] == stop["stop_id"], name
        else:
            assert (refused["code"], refused["tripwire"], refused["scope"]) == (
                "tripwire_tripped",
                RUN_RULE,
                f"run:{run['run_id']}",
            ), name
        assert stop["reason"].endswith(" refused"), name  # the gateway's evidence: the sixth call refused
        assert run["intents"] == 5 and len(run["proposals"]) == 5, name
        # The content rule in shadow mode fired at the injected review, before the first refund.
        assert (shadow["rule"], shadow["actor"]) == (CONTENT_RULE, TRIPWIRE), name
        assert shadow["recorded_at"] < run["first_committed_at"], name
        assert "content signals in the result of read_order: builtin instruction_override" in shadow["reason"], name
        # The agent saw its five refunds committed, and the layers after the tripwire held.
        assert [p["state"] for p in run["proposals"]] == ["committed"] * 5, name
        assert (run["renewal_refused"]["code"], run["renewal_refused"]["stop_id"]) == (
            "stopped",
            stop["stop_id"],
        ), name
        assert run["credential_refused"]["code"] == "stopped", name
        assert run["lease_notice"]["stop_id"] == stop["stop_id"], name
        # On-call was paged for the run, with what its report says.
        assert (page["event"], page["subject"], page["run_id"], page["actor"]) == (
            "stop",
            stop["stop_id"],
            run["run_id"],
            TRIPWIRE,
        ), name
        assert page["committed"] == [c["intent_id"] for c in run["proposals"]] and page["cancelled"] == [], name
        assert page["report_url"].endswith(f"/v1/runs/{run['run_id']}/report"), name
        assert f"tripwire {RUN_RULE}" in page["summary"], name
        # Restart deliberately: cleared with a reason, a new run resumed from the last checkpoint.
        restart, last = run["restart"], run["last_checkpoint"]
        assert restart["reason"] and restart["run_id"] != run["run_id"], name
        # (The sixth order is in it when the agent saw its intent cancelled before the push.)
        assert restart["checkpoint"] == last and last["orders_done"][-1] in AFTER[4:6], name
        events = {e["event"]: e["ms"] for e in run["timeline"]}
        assert events["content tripwire fired (shadow)"] <= events["refund 1 proposed"], name
        assert events["refund 5 committed"] <= events["refund 6 called"] <= events["stop written"], name
        # The page goes out once the stop commits: before or after the demo's renewal, as it happens.
        assert events["stop written"] <= events["lease renewal refused"], name
        assert events["stop written"] <= events["on-call paged"] <= events["stop cleared"], name
    # The call log replayed: per run, the same two firings at the same calls as live, no other.
    backtest = out["backtest"]
    assert backtest["same"] and backtest["deviations"] == {} and backtest["rules"] == 3
    by_run = {r["run_id"]: sorted((f["rule"], f["tool"], f["in_log"]) for f in backtest["firings"] if f["run"] == r["run_id"]) for r in runs}  # fmt: skip
    expected = sorted([(CONTENT_RULE, "read_order", True), (RUN_RULE, "issue_refund", True)])
    assert all(found == expected for found in by_run.values()), by_run
    assert len(backtest["firings"]) == 2 * count
    print(f"{count} runs: stack up in {out['stack_start_s']} s, {out['elapsed_s']} s in all")


def test_one_run_prints_the_timeline_the_report_the_ledger_and_the_reversal_script(tmp_path: Path) -> None:
    done = demo("--keep", str(tmp_path), timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    # Progress on stderr while the long steps run.
    for step in ("starting the stack", "stack up in", "run 1/1: 5 refunds, as expected", "replaying"):
        assert f"haltwire demo refunds: {step}" in done.stderr, done.stderr
    text = done.stdout
    for line in (
        "prompt injection read",
        "content tripwire fired (shadow)",
        f"{CONTENT_RULE} would have stopped the run here, before its first refund",
        "refund 1 proposed",
        "refund 5 committed",
        "refund 6 called",
        "refund 6 refused at the gateway",
        ": no intent written",
        f"by {TRIPWIRE}: tripwire {RUN_RULE} (steps, enforce)",
        "lease ended in the agent",
        "lease renewal refused",
        "credential renewal refused",
        "409 stopped",
        "on-call paged",
        "stop cleared",
        "run resumed",
        "the report's committed refunds match the shop's ledger",
        "The page on-call received",
        "cancelled: none",
        "1/1 runs capped at exactly 5 refunds",
    ):
        assert line in text, line
    assert "refund 6 committed" not in text and "refund 6 proposed" not in text and "refund 7" not in text
    # The page names the run and lists its five committed refunds (the receiver's own output).
    page = text[text.index("The page on-call received") : text.index("#!/usr/bin/env bash")]
    run_id = text.split()[2].rstrip(":").strip()
    assert f"run:       {run_id}" in page and f"/v1/runs/{run_id}/report" in page
    assert [line.split()[2] for line in page.splitlines() if line.startswith("  committed:")] == AFTER[:5]
    assert PAGER in text
    script = text[text.index("#!/usr/bin/env bash") :].splitlines()
    reversals = [line.split() for line in script if line.startswith("reverse re_")]
    assert [(r[2], r[3]) for r in reversals] == [
        (order, str(min(ORDERS[order].amount_cents, 20_000))) for order in AFTER[:5]
    ]
    # Each reversal names a refund the shop applied (the ledger table lists it too).
    assert all(text.count(r[1]) >= 4 for r in reversals)  # the timeline, report, ledger and script
    # The call log it kept (--keep), as a user replays it.
    assert "the same firings at the same calls as live" in text
    the_kept_log_replays_to_the_same_firings_and_a_lower_limit_fires_earlier(tmp_path, run_id)


def the_kept_log_replays_to_the_same_firings_and_a_lower_limit_fires_earlier(tmp_path: Path, run_id: str) -> None:
    config, log = tmp_path / "gateway.toml", tmp_path / "calls.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    refunds = [i for i, r in enumerate(records) if r["tool"] == "issue_refund" and r["run"] == run_id]
    assert len(refunds) == 6 and records[refunds[5]]["outcome"] == "tripwire_tripped"
    assert "arguments" not in records[0] and "amount_cents" not in log.read_text()  # no raw arguments
    # As ``haltwire tripwires test`` replays it: the same firings at the same calls, exit 0.
    same = replay(config, log)
    assert same.returncode == 0, same.stdout + same.stderr
    out = json.loads(same.stdout)
    assert out["same"] and out["calls"] == len(records)
    assert sorted((f["rule"], f["index"]) for f in out["firings"]) == sorted(
        [(RUN_RULE, refunds[5]), (CONTENT_RULE, max(i for i, r in enumerate(records[: refunds[0]]) if r["tool"] == "read_order"))]
    )  # fmt: skip
    # What if the limit had been 4: the replay fires at the fifth refund, and says it differs.
    data = tomllib.loads(config.read_text())
    for rule in data["tripwires"]:
        if rule["name"] == RUN_RULE:
            rule["limit"] = 4
    config.write_text(tomli_w.dumps(data))
    lower = replay(config, log)
    assert lower.returncode == 1, lower.stdout + lower.stderr
    out = json.loads(lower.stdout)
    fired = [(f["index"], f["in_log"]) for f in out["firings"] if f["rule"] == RUN_RULE and f.get("replayed") is not False]
    assert fired == [(refunds[4], False)] and not out["same"]
