"""The README's snippets as written: its runtime agent against the example configs.

The three processes of the examples start from copies of ``examples/control.toml`` and
``examples/gateway.toml`` (their relative files land beside the copies), on the ports the
README names, in the wrong order on purpose (the gateway first). The agent is the README's
Python block under "Runs, leases and the runtime SDK", run as a program; ``haltwire stop`` as
the README writes it ends its run.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

from cli_process import run_haltwire
from gateway_processes import HALTWIRE, Processes, wait_ready

ROOT = Path(__file__).parent.parent
#: The ports of the examples: the control plane's three listeners, the gateway, the demo upstream.
PORTS = (8700, 8701, 8702, 8800, 8900)


def snippet(heading: str, language: str = "python") -> str:
    """The first ``language`` block after ``heading`` in the README."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(heading) :]
    found = re.search(rf"```{language}\n(.*?)```", after, re.S)
    assert found is not None, f"no {language} block after {heading!r}"
    return found.group(1)


def taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_readme_runtime_agent_runs_against_the_examples_until_a_stop_ends_it(
    tmp_path: Path, procs: Processes
) -> None:
    busy = [p for p in PORTS if taken(p)]
    assert not busy, f"the README's ports {busy} are taken on this machine: stop what holds them"
    for name in ("control.toml", "gateway.toml"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    procs.spawn("gateway", [*HALTWIRE, "gateway", "--config", str(tmp_path / "gateway.toml")])
    procs.spawn("upstream", [*HALTWIRE, "demo", "upstream", "--port", "8900"])
    procs.spawn("control", [*HALTWIRE, "control", "--config", str(tmp_path / "control.toml")])
    wait_ready(procs, "gateway", "http://127.0.0.1:8800/readyz")

    agent = tmp_path / "agent.py"
    agent.write_text(snippet("### Runs, leases and the runtime SDK"))
    out = tmp_path / "agent.out"
    with out.open("wb") as sink:
        proc = procs.spawn("agent", [sys.executable, str(agent)], stdout=sink)

    def said() -> list[str]:
        return out.read_text().splitlines()

    deadline = time.monotonic() + 30
    while said().count("order A-1 looked up") < 2:
        assert proc.poll() is None, f"the agent exited {proc.returncode}:\n{out.read_text()}\n{procs.log_tail('agent')}"
        assert time.monotonic() < deadline, f"the agent made no calls:\n{procs.log_tail('agent')}"
        time.sleep(0.1)

    # As "The control plane" writes it: an operator's token, the operators' listener.
    env = {**os.environ, "HALTWIRE_CONTROL_URL": "http://127.0.0.1:8701", "HALTWIRE_TOKEN": "tok-oncall"}
    stopped = run_haltwire("stop", "--agent", "ops-bot", "--reason", "refund storm", env=env)
    assert stopped.returncode == 0 and stopped.stdout.startswith("stp_"), stopped.stderr
    assert proc.wait(timeout=20) == 0, procs.log_tail("agent")
    last = said()[-1]
    assert last.startswith(("stopped: ", "refused: stopped: ")), said()
    assert "refund storm" in last, last
    assert not any("lease_invalid" in line for line in said()), said()
