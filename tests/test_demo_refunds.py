"""``haltwire demo refunds``: the seed's refund incident with real processes, capped at five refunds.

Each test runs the command as a user does (a subprocess that starts the control plane, the
shop, the gateway and the executor as processes of their own) and checks what it printed
against the seed: five refunds applied by the shop per run, the sixth intent cancelled by the
executor's final check with the intent limit's stop, and the run report equal to the shop's
own ledger.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from haltwire.demo.shop import INJECTED_ORDER, ORDERS

pytestmark = pytest.mark.slow

RUNS = 50
#: The five orders refunded, and the sixth: the injected one and those read after it.
AFTER = list(ORDERS)[list(ORDERS).index(INJECTED_ORDER) :]


def demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwire", "demo", "refunds", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(refunds: list[dict[str, Any]]) -> list[tuple[str, str, int, str]]:
    return sorted((r["idempotency_key"], r["order_id"], r["amount_cents"], r["refund_id"]) for r in refunds)


@pytest.mark.timeout(300)
def test_fifty_runs_are_each_capped_at_exactly_five_refunds_and_the_report_matches_the_shop() -> None:
    done = demo("--runs", str(RUNS), "--json", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    runs = out["runs"]
    assert out["ok"] and out["problems"] == []
    assert len(runs) == RUNS and len({r["run_id"] for r in runs}) == RUNS
    assert out["shop_applied_total"] == 5 * RUNS, "no refund outside the runs' intents"
    for run in runs:
        name = f"run {run['run']} ({run['run_id']})"
        assert run["applied"] == 5, name
        # The report (control plane) and the ledger (the upstream) agree on every refund.
        assert rows(run["committed"]) == rows(run["ledger"]), name
        assert all(r["refund_id"] for r in run["committed"]), name
        assert [r["order_id"] for r in run["committed"]] == AFTER[:5], name
        stop, sixth = run["stop"], run["sixth"]
        assert (stop["scope"], stop["issued_by"]) == (f"run:{run['run_id']}", "intent-limit"), name
        assert (sixth["state"], sixth["stop_id"], sixth["order_id"]) == (
            "cancelled",
            stop["stop_id"],
            AFTER[5],
        ), name
        assert sixth["claimed_by"] == "executor-1" and sixth["cancelled_by_check"], name
        # The agent saw its five refunds committed, and the layers after the tripwire held.
        assert [p["state"] for p in run["proposals"][:5]] == ["committed"] * 5, name
        assert len(run["proposals"]) == 6, name
        assert (run["renewal_refused"]["code"], run["renewal_refused"]["stop_id"]) == (
            "stopped",
            stop["stop_id"],
        ), name
        assert run["credential_refused"]["code"] == "stopped", name
        assert run["lease_notice"]["stop_id"] == stop["stop_id"], name
        # Restart deliberately: cleared with a reason, a new run resumed from the last checkpoint.
        restart, last = run["restart"], run["last_checkpoint"]
        assert restart["reason"] and restart["run_id"] != run["run_id"], name
        # (The sixth order is in it when the agent saw its intent cancelled before the push.)
        assert restart["checkpoint"] == last and last["orders_done"][-1] in AFTER[4:6], name
        events = {e["event"]: e["ms"] for e in run["timeline"]}
        assert events["refund 5 committed"] <= events["stop written"] <= events["intent 6 cancelled"], name
        assert events["stop written"] <= events["lease renewal refused"], name
    print(f"{RUNS} runs: stack up in {out['stack_start_s']} s, {out['elapsed_s']} s in all")


def test_one_run_prints_the_timeline_the_report_the_ledger_and_the_reversal_script() -> None:
    done = demo(timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    for line in (
        "prompt injection read",
        "refund 1 proposed",
        "refund 5 committed",
        "refund 6 proposed",
        "stop written",
        "intent 6 cancelled",
        "by the executor's final check",
        "lease ended in the agent",
        "lease renewal refused",
        "credential renewal refused",
        "409 stopped",
        "stop cleared",
        "run resumed",
        "the report's committed refunds match the shop's ledger",
        "1/1 runs capped at exactly 5 refunds",
    ):
        assert line in text, line
    assert "refund 6 committed" not in text and "refund 7" not in text
    script = text[text.index("#!/usr/bin/env bash") :].splitlines()
    reversals = [line.split() for line in script if line.startswith("reverse re_")]
    assert [(r[2], r[3]) for r in reversals] == [
        (order, str(min(ORDERS[order].amount_cents, 20_000))) for order in AFTER[:5]
    ]
    # Each reversal names a refund the shop applied (the ledger table lists it too).
    assert all(text.count(r[1]) >= 4 for r in reversals)  # the timeline, report, ledger and script
