"""``haltwire drill`` against a running stack (a control plane and a gateway this test starts), and
what a drill leaves behind: no active stop, no live run, and every audit record of its tenant
marked as drill data (none of anyone else's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from drill_harness import OPS_TOKEN, REAL_AGENT, StackToDrill, drill, stack_to_drill
from haltwire.demo.processes import Processes
from haltwire.drill.stack import TOKENS

DRILL_IDENTITIES = {"drill-operator", "drill-canary-runtime"}


def _ops(stack: StackToDrill) -> httpx2.Client:
    return httpx2.Client(base_url=stack.admin_url, headers={"Authorization": f"Bearer {OPS_TOKEN}"}, timeout=10)


def _haltwire(stack: StackToDrill, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "haltwire", *args, "--url", stack.admin_url, "--token", OPS_TOKEN],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def _about_the_drill(record: dict[str, Any], runs: set[str], stops: set[str]) -> bool:
    detail = record["detail"]
    return (
        record["actor"] in DRILL_IDENTITIES
        or record["target"] in runs | stops | {"tenant:drill"} | {f"run:{r}" for r in runs}
        or detail.get("stop_id") in stops
        or detail.get("run_id") in runs
    )


@pytest.mark.timeout(180)
def test_a_drill_of_a_running_stack_measures_its_rungs_and_leaves_only_marked_drill_data(tmp_path: Path) -> None:
    with stack_to_drill(tmp_path) as stack, _ops(stack) as ops:
        # Someone else's incident, before the drill: a real stop and a real run.
        with httpx2.Client(timeout=10) as http:
            r = http.post(f"{stack.agents_url}/v1/runs", json={}, headers={"Authorization": f"Bearer {REAL_AGENT['token']}"})
            assert r.status_code == 201, r.text
            real_run = r.json()["run"]["run_id"]
        real_stop = ops.post("/v1/stops", json={"scope": "tenant:acme", "reason": "a real incident"})
        assert real_stop.status_code == 201, real_stop.text

        done = drill(*stack.args(stack.token_file(tmp_path)), "--reps", "3", "--json", "--seed", "4",
                     embedded=False, timeout=150)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "the fail_closed rung is skipped: the drill cannot make a control plane" in done.stderr
        data: dict[str, Any] = json.loads(done.stdout)
        rungs = {r["rung"]: r for r in data["rungs"]}
        skipped = ["model", "broker", "egress", "executor", "fail_closed"]
        assert list(rungs) == ["sdk", "gateway", *skipped] and sorted(data["skipped"]) == sorted(skipped)
        for name in skipped:  # their parts are the drill's own stack's, or its control plane
            assert rungs[name]["verdict"] == "skipped" and rungs[name]["samples"] == 0
            assert f"the {name} rung is skipped: " in data["skipped"][name] == rungs[name]["skipped"]
        kinds = set(rungs["sdk"]["scope_kinds"]) | set(rungs["gateway"]["scope_kinds"])
        assert kinds == {"run", "tenant", "agent", "version", "tool"}  # never global on a running stack
        assert data["agent_class"] == {"name": "canary", "ttl_s": 3.0, "time_to_stop_s": 3.0}
        assert data["left_behind"] == {"active_stops": 0, "runs_not_ended": 0, "unmarked_records": 0}
        assert sum(r["side_effects_total"] for r in rungs.values()) == data["canary_record_total"] > 0
        for name in ("sdk", "gateway"):
            assert rungs[name]["samples"] == 3 and rungs[name]["verdict"] == "pass"

        # No active stop but the real one; every drill stop cleared and marked.
        active = ops.get("/v1/stops").json()["stops"]
        assert [(s["scope"], s["drill"]) for s in active] == [("tenant:acme", False)]
        every = ops.get("/v1/stops", params={"all": "1"}).json()["stops"]
        drill_stops = {s["stop_id"] for s in every if s["issued_by"] == "drill-operator"}
        assert len(drill_stops) == 6
        assert all(s["cleared"] and s["drill"] for s in every if s["stop_id"] in drill_stops)
        # No live drill run; every run of the drill tenant marked, the real one not.
        runs = ops.get("/v1/runs").json()["runs"]
        drill_runs = {r["run_id"] for r in runs if r["tenant"] == "drill"}
        assert len(drill_runs) == 6 + 1  # the reps', and the start-up check's
        assert all(r["ended_at"] is not None and r["drill"] for r in runs if r["run_id"] in drill_runs)
        assert [(r["run_id"], r["drill"]) for r in runs if r["tenant"] != "drill"] == [(real_run, False)]
        # Every audit record is marked exactly when it is about the drill.
        records = ops.get("/v1/audit").json()["records"]
        marked = [r for r in records if r["detail"].get("drill") is True]
        assert [r["seq"] for r in marked] == [
            r["seq"] for r in records if _about_the_drill(r, drill_runs, drill_stops)
        ]
        assert len(marked) >= 6 * 2 + 7 and len(records) - len(marked) >= 2  # the real stop and run
        assert ops.get("/v1/audit/verify").json()["ok"] is True

        # The operator's commands say so.
        lines = _haltwire(stack, "audit").splitlines()
        assert sum("[drill]" in line for line in lines) == len(marked)
        assert sum("[drill]" in line for line in _haltwire(stack, "stops", "--all").splitlines()) == 6
        assert "[drill: a drill's run, not an incident]" in _haltwire(stack, "report", sorted(drill_runs)[0])
        assert "[drill" not in _haltwire(stack, "report", real_run)


@pytest.mark.timeout(120)
def test_a_running_stack_missing_what_a_drill_needs_is_named_in_one_sentence(tmp_path: Path) -> None:
    from haltwire.drill.remote import RemoteStack, TargetMissing, check_agent_token, check_identities

    async def missing(stack: RemoteStack) -> str:
        with pytest.raises(TargetMissing) as caught:
            await check_identities(stack)
            await check_agent_token(stack)
        return str(caught.value)

    with stack_to_drill(tmp_path) as stack:
        cases = [
            ({"operator": OPS_TOKEN}, "identity ops is not a drill identity: give it drill = true"),
            ({"runtime": str(REAL_AGENT["token"])}, "identity acme-worker is not a drill identity"),
            ({"operator": "tok-nobody"}, "admin listener at http://127.0.0.1:"),
            ({"operator": TOKENS["runtime"]}, "refuses the token file's token for it"),
            ({"agent": TOKENS["runtime"]}, "does not know the token file's agent token"),
        ]
        # A canary where the gateway's route points: a gateway serves nothing until it reaches it.
        processes = Processes(tmp_path)
        try:
            canary = processes.spawn("canary", "-m", "haltwire.drill.canary", "--port", str(stack.canary_port))
            canary.wait_http(f"http://127.0.0.1:{stack.canary_port}/record")
            for tokens, sentence in cases:
                good = {"operator": TOKENS["operator"], "runtime": TOKENS["runtime"], "agent": TOKENS["agent"]}
                target = RemoteStack(stack.admin_url, stack.agents_url, stack.gateway_url, good | tokens, "http://x")
                said = anyio.run(missing, target)
                assert sentence in said and "\n" not in said, said
        finally:
            processes.close()
        # As a command: the gateway's canary route points elsewhere than where its canary listens.
        args = stack.args(stack.token_file(tmp_path))
        other = str(stack.canary_port + 1)
        args[args.index("--canary-port") + 1] = other
        done = drill(*args, "--reps", "1", embedded=False)
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("haltwire drill: the stack is not ready for a drill: the gateway")
        assert f"to the drill's canary at http://127.0.0.1:{other}/mcp" in done.stderr
        assert "Traceback" not in done.stderr
        with _ops(stack) as ops:  # a failed check leaves nothing behind either
            assert ops.get("/v1/stops").json()["stops"] == []
            assert all(r["ended_at"] is not None for r in ops.get("/v1/runs").json()["runs"])


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--control", "http://127.0.0.1:9"], "needs --control, --agents, --gateway and --token-file"),
        (["--embedded", "--gateway", "http://127.0.0.1:9"], "--embedded drills a stack of its own"),
    ],
)
def test_bad_running_stack_usage_exits_2_with_a_sentence(
    args: list[str], sentence: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from haltwire.cli import build_parser
    from haltwire.drill.command import run

    assert run(build_parser().parse_args(["drill", *args])) == 2
    assert sentence in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("operator = 'x'\nruntime = 'y'\nsecret = 'z'\n", "unknown key secret"),
        ("operator = 'x'\n", "runtime must be a token"),
        ("operator = [\n", "is not TOML"),
    ],
)
def test_a_bad_token_file_exits_2_with_a_sentence(
    text: str, sentence: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from haltwire.cli import build_parser
    from haltwire.drill.command import run

    path = tmp_path / "tokens.toml"
    path.write_text(text)
    url = "http://127.0.0.1:9"
    argv = ["drill", "--control", url, "--agents", url, "--gateway", url, "--token-file", str(path)]
    assert run(build_parser().parse_args(argv)) == 2
    assert sentence in capsys.readouterr().err
