"""The OpenAI Agents SDK example: a runaway agent, stopped mid-run by an operator's stop.

Real servers on loopback (control plane on SQLite, demo upstream, gateway requiring a lease,
the fake Responses endpoint), the real ``agents`` Runner and the real MCP client.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed (it is in the dev extra)")

# The example lives outside the package, under the repository's examples/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.openai_agents import agent as example

pytestmark = pytest.mark.anyio


def orders(n: int) -> list[str]:
    return [f"order A-{i}: shipped" for i in range(1, n + 1)]


# think_s 0.2: the pushed stop usually lands while the model "thinks" (a model call cancelled
# in flight); 0: it usually lands at the next tool call. Either way the run must end by it.
# Without push, the lease would hold until its next renewal (5 s): the gateway's refusal of
# the next call (level 3) is what ends the run, with the same stop.
@pytest.mark.parametrize(
    ("think_s", "push"), [(0.2, True), (0.0, True), (0.2, False)], ids=["thinking", "fast", "gateway"]
)
async def test_a_stop_issued_mid_run_ends_the_agent_run(tmp_path: Path, think_s: float, push: bool) -> None:
    transcript = await example.scenario(tmp_path, stop_after=3, think_s=think_s, push=push)
    notice = transcript.notice
    assert notice is not None, transcript.other_end
    assert notice.code == "stopped"
    assert notice.stop_id is not None and notice.stop_id.startswith("stp_")
    assert notice.stop_id == transcript.issued["stop_id"]
    assert notice.scope == f"run:{transcript.run_id}"
    assert notice.reason == example.REASON
    # The model calls go through the gateway too: it may refuse (or cut) the next model call.
    at_the_gateway = ("tool call (refused at the gateway)", "model call (refused at the gateway)")
    if push:  # the gateway hears the same stop on its own watch, and may hear it first
        assert transcript.ended_in in ("before a model call", "model call", "tool call", *at_the_gateway)
    else:
        assert transcript.ended_in in at_the_gateway

    # The operator stopped it after the 3rd call. A busy machine lets a few more through before
    # the push arrives (the fast agent calls every few ms; timing is not this test's to judge);
    # a runaway would go on to max_turns (1000).
    calls = len(transcript.calls)
    assert 3 <= calls <= 20, transcript.calls
    # Nothing reached the upstream once the stop had reached the run.
    assert transcript.served_when_stopped is not None
    assert transcript.served_at_exit == transcript.served_when_stopped
    assert transcript.served_at_exit in (calls, calls + 1)  # + a call cut off after it was served

    # What the model read: each result, in order, the last one possibly never read.
    assert transcript.read == orders(len(transcript.read))
    assert len(transcript.read) in (calls, calls - 1)
    assert transcript.calls[0] == "lookup_order('A-1') -> order A-1: shipped"

    lines = transcript.lines()
    # The model reads every result but, possibly, the last: the gateway may refuse (or cut) the
    # model call that carries it, before the model is sent it.
    read = len(transcript.read)
    assert lines[2 : 2 + read] == [f"  {i}. order A-{i}: shipped" for i in range(1, read + 1)]
    finished = f"finished: stopped by {notice.stop_id}: {example.REASON} after {calls} tool calls"
    assert lines[-1] == finished


async def test_main_prints_the_transcript_and_exits_0_when_the_stop_ended_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await example.amain() == 0
    out = capsys.readouterr().out
    assert "the model read:\n  1. order A-1: shipped\n" in out
    assert "stop notice (" in out and "scope run:run_" in out
    assert "finished: stopped by stp_" in out
