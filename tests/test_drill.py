"""``haltwire drill --embedded``, run as a command: its own stack, its canaries, its figures.

A short drill over every rung, whose JSON must agree with the canary records (the upstream's,
the targets'); and drills whose rungs are broken on purpose (a gateway configured without
``[control]``, or no gateway in front of the runtimes that ignore stops), so the drill fails and
names each rung.
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

#: The stop rungs take the scope kinds round-robin: two reps of every rung cover them all.
KINDS = {"run", "tenant", "agent", "version", "global", "tool", "model"}
RUNGS = ["sdk", "gateway", "model", "broker", "egress", "executor", "fail_closed"]
#: Where each rung's side effects are recorded: the canary upstream, or the canary targets.
RECORD = {"model": "targets", "broker": "targets", "egress": "targets"}
REPS = 2


@pytest.mark.timeout(150)
def test_a_short_drill_measures_every_rung_and_agrees_with_the_canary_records() -> None:
    done = drill("--reps", str(REPS), "--json", "--seed", "7", timeout=140)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    rungs = {r["rung"]: r for r in data["rungs"]}
    assert list(rungs) == RUNGS
    assert data["ok"] is True and data["broken"] == {} and data["skipped"] == {}
    assert data["left_behind"] == {"active_stops": 0, "runs_not_ended": 0, "unmarked_records": 0}
    assert set().union(*(r["scope_kinds"] for r in rungs.values())) - {"unreachable"} == KINDS
    assert rungs["fail_closed"]["scope_kinds"] == ["unreachable"]
    target = data["agent_class"]["time_to_stop_s"]
    assert target >= data["agent_class"]["ttl_s"]
    # Every side effect each canary record holds belongs to one measured run of its rungs.
    assert sum(r["side_effects_total"] for r in rungs.values()) == data["canary_record_total"]
    for record, total in data["canary_records"].items():
        assert (
            sum(
                r["side_effects_total"] for r in rungs.values() if RECORD.get(r["rung"], "upstream") == record
            )
            == total
        )
    for rung in rungs.values():
        assert rung["samples"] == (2 * REPS if rung["rung"] == "fail_closed" else REPS)
        assert rung["target_s"] == target and rung["verdict"] == "pass"
        assert rung["to_last_side_effect_s"]["max"] <= target
        assert rung["to_first_refusal_s"]["max"] <= target
        after = rung["side_effects_after_stop"]
        assert after["count"] == sum(len(rep["effects_after"]) for rep in rung["reps"])
        assert rung["decided_after_stop"] == {"count": 0, "what": []}
        for rep in rung["reps"]:
            assert rep["refusal"] is not None and rep["broken"] is None
            assert rep["effects_total"] >= 1, rep  # each stop came after a side effect
            if rung["rung"] == "executor":
                # A call served is an intent; each intent performed is one side effect recorded.
                assert rep["effects_total"] == rep["intents"]["committed"], rep
                assert rep["served_seen"] <= sum(rep["intents"].values()) <= rep["served_seen"] + 1, rep
            elif rung["rung"] == "model":
                # Tokens the provider sent, against those the runtime read: a few lost in the cut
                # (sent before the provider saw the gateway hang up; generous on a loaded machine).
                assert rep["served_seen"] <= rep["effects_total"] <= rep["served_seen"] + 10, rep
            else:
                # The canary's count and the runtime's: at most one call cut in flight between them.
                assert rep["served_seen"] <= rep["effects_total"] <= rep["served_seen"] + 1, rep
    # The SDK's lease ends on a pushed stop of one of its scopes (a tool stop is the gateway's).
    assert any(rep["lease_end_s"] is not None for rep in rungs["sdk"]["reps"])
    assert {rep["runtime"] for rep in rungs["fail_closed"]["reps"]} == {"sdk", "ignoring"}
    for name in ("gateway", "model", "broker", "egress", "executor"):
        assert {rep["runtime"] for rep in rungs[name]["reps"]} == {"ignoring"}
    # The stop cut the open stream and the open tunnel; then new ones were refused.
    for name in ("model", "egress"):
        assert all(rep["cut_s"] is not None for rep in rungs[name]["reps"]), rungs[name]["reps"]
        assert rungs[name]["to_cut_s"]["max"] <= target
    assert {rep["refusal"] for rep in rungs["egress"]["reps"]} == {"stopped"}
    # The downstream refused the credential it had accepted: every stop revokes it.
    assert {rep["refusal"] for rep in rungs["broker"]["reps"]} == {"credential_revoked"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("broken", "rungs"),
    [("gateway-without-control", ["gateway", "executor"]), ("no-gateway", ["gateway", "model"])],
)
def test_a_broken_rung_fails_the_drill_with_a_sentence_naming_it(broken: str, rungs: list[str]) -> None:
    # A gateway configured without [control] (no stops heard, no intents), or runtimes that ignore
    # stops with no gateway in front: nothing stops the ignoring canaries of these rungs.
    done = drill("--reps", "1", "--rungs", ",".join(rungs), "--break", broken, "--seed", "1")
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())  # the terminal wraps sentences
    for rung in rungs:
        assert f"the {rung} rung is broken: the ignoring canary was not refused within" in said, rung
    for rung in rungs:
        assert rung in done.stdout  # the table, with the rung judged
    assert done.stdout.count("broken") == len(rungs)


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--embedded", "--reps", "0"], "--reps must be at least 1"),
        ([], "give --embedded"),
        (["--embedded", "--rungs", "brokers"], "unknown rung brokers"),
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


@pytest.mark.timeout(90)
def test_sigterm_takes_the_drills_stack_down_and_exits_130() -> None:
    command = [sys.executable, "-m", "haltwire", "drill", "--embedded", "--reps", "20"]
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        deadline = time.monotonic() + 60
        # The control plane, the canary upstream and targets, the gateway, egress, the executor.
        while len(stack := _children(child.pid)) < 6:
            assert time.monotonic() < deadline and child.poll() is None, "the drill's stack did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # into the reps
        child.terminate()
        _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "interrupted; its stack is down" in err
    assert not {pid for pid in stack if Path(f"/proc/{pid}").exists()}


def test_a_rung_whose_part_cannot_run_here_is_skipped_with_a_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haltwire.drill import parts

    assert [r for r in ("model", "broker", "egress", "executor") if parts.unavailable(r)] == []
    assert parts.needed(["sdk", "gateway", "fail_closed"]) == frozenset()
    assert parts.needed(["egress", "executor"]) == {"targets", "egress", "executor"}
    monkeypatch.setitem(parts.MODULES, "egress", "haltwire_no_such_module")  # as if not installed
    assert parts.unavailable("egress") == (
        "the egress rung is skipped: its egress cannot run here (haltwire_no_such_module is not installed)"
    )
    assert parts.unavailable("model") is None


def test_a_rep_failing_in_several_tasks_breaks_its_rung_rather_than_the_command() -> None:
    # Both canaries of a fail_closed rep failing to register come out of nested task groups.
    from haltwire.drill.command import one_failure
    from haltwire.runtime import ControlUnreachable

    first, second = ControlUnreachable("POST /v1/runs: ReadTimeout"), ControlUnreachable("again")
    with pytest.raises(ControlUnreachable) as caught, one_failure():
        raise ExceptionGroup("rep", [ExceptionGroup("runtimes", [first, second])])
    assert caught.value is first
    with pytest.raises(ExceptionGroup), one_failure():  # a bug is not a broken rung: raised whole
        raise ExceptionGroup("rep", [first, ValueError("a bug")])
