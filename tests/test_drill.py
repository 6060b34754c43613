"""``haltwire drill --embedded``, run as a command: its own stack, its canaries, its figures.

A short drill over every rung of this slice, whose JSON must agree with the canary upstream's
own record; and drills whose ``gateway`` rung is broken on purpose (a gateway configured without
``[control]``, or no gateway in front of the runtime that ignores stops), so the drill fails and
says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from drill_harness import drill

#: The stop rungs take the scope kinds round-robin: three reps of two rungs cover all six.
KINDS = {"run", "tenant", "agent", "version", "global", "tool"}


@pytest.mark.timeout(120)
def test_a_short_drill_measures_every_rung_and_agrees_with_the_canary_record() -> None:
    done = drill("--reps", "3", "--json", "--seed", "7")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    rungs = {r["rung"]: r for r in data["rungs"]}
    assert list(rungs) == ["sdk", "gateway", "fail_closed"]
    assert data["ok"] is True and data["broken"] == {}
    assert data["left_behind"] == {"active_stops": 0, "runs_not_ended": 0, "unmarked_records": 0}
    assert set(rungs["sdk"]["scope_kinds"]) | set(rungs["gateway"]["scope_kinds"]) == KINDS
    assert rungs["fail_closed"]["scope_kinds"] == ["unreachable"]
    target = data["agent_class"]["time_to_stop_s"]
    assert target >= data["agent_class"]["ttl_s"]
    # Every side effect the canary upstream recorded belongs to one measured run.
    assert sum(r["side_effects_total"] for r in rungs.values()) == data["canary_record_total"]
    for rung in rungs.values():
        assert rung["samples"] == (6 if rung["rung"] == "fail_closed" else 3)
        assert rung["target_s"] == target and rung["verdict"] == "pass"
        assert rung["to_last_side_effect_s"]["max"] <= target
        assert rung["to_first_refusal_s"]["max"] <= target
        after = rung["side_effects_after_stop"]
        assert after["count"] == sum(len(rep["effects_after"]) for rep in rung["reps"])
        for rep in rung["reps"]:
            # The canary's count and the runtime's: at most one call cut in flight between them.
            assert rep["served_seen"] <= rep["effects_total"] <= rep["served_seen"] + 1, rep
            assert rep["refusal"] is not None and rep["broken"] is None
    # The SDK's lease ends on a pushed stop of one of its scopes (a tool stop is the gateway's).
    assert any(rep["lease_end_s"] is not None for rep in rungs["sdk"]["reps"])
    assert {rep["runtime"] for rep in rungs["fail_closed"]["reps"]} == {"sdk", "ignoring"}
    assert {rep["runtime"] for rep in rungs["gateway"]["reps"]} == {"ignoring"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("broken", ["gateway-without-control", "no-gateway"])
def test_a_broken_gateway_rung_fails_the_drill_with_a_sentence_naming_it(broken: str) -> None:
    # A gateway configured without [control], or a runtime that ignores stops with no gateway in
    # front: nothing stops the ignoring canary.
    done = drill("--reps", "1", "--rungs", "gateway", "--break", broken, "--seed", "1")
    assert done.returncode == 1, done.stderr
    assert "the gateway rung is broken: the ignoring canary was not refused within" in done.stderr
    assert "gateway" in done.stdout  # the table, with the rung judged
    assert "broken" in done.stdout


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--embedded", "--reps", "0"], "--reps must be at least 1"),
        ([], "give --embedded"),
        (["--embedded", "--rungs", "broker"], "unknown rung broker"),
    ],
)
def test_bad_usage_exits_2_with_a_sentence(
    args: list[str], sentence: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from haltwire.cli import build_parser
    from haltwire.drill.command import run

    assert run(build_parser().parse_args(["drill", *args])) == 2
    assert sentence in capsys.readouterr().err


def test_only_refusals_after_the_drill_armed_the_run_count_as_the_stops() -> None:
    # A gateway that has not yet heard the last clear may refuse a new run's first calls.
    from haltwire.drill.agents import CanaryRun

    run = CanaryRun("ignoring")
    run.refuse("stopped")
    assert run.early == ["stopped"] and run.refused_at is None and not run.refused.is_set()
    run.armed = True
    run.refuse("lease_invalid")
    run.refuse("stopped")
    assert run.refusal == "lease_invalid" and run.refused_at is not None and run.refused.is_set()


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


@pytest.mark.timeout(60)
def test_sigterm_takes_the_drills_stack_down_and_exits_130() -> None:
    command = [sys.executable, "-m", "haltwire", "drill", "--embedded", "--reps", "20"]
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        deadline = time.monotonic() + 30
        while len(stack := _children(child.pid)) < 3:  # the control plane, the canary, the gateway
            assert time.monotonic() < deadline and child.poll() is None, "the drill's stack did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # into the reps
        child.terminate()
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "interrupted; its stack is down" in err
    assert not {pid for pid in stack if Path(f"/proc/{pid}").exists()}
