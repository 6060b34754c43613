"""The OpenAI Agents SDK example: a runaway agent, stopped mid-run by an operator's stop.

Real servers on loopback (control plane on SQLite, demo upstream, gateway requiring a lease,
the fake Responses endpoint), the real ``agents`` Runner and the real MCP client.
"""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest

pytest.importorskip("agents", reason="openai-agents is not installed (it is in the dev extra)")

# The example lives outside the package, under the repository's examples/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.openai_agents import agent as example
from examples.openai_agents.stack import REASON

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
    assert notice.reason == REASON
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
    finished = f"finished: stopped by {notice.stop_id}: {REASON} after {calls} tool calls"
    assert lines[-1] == finished


async def test_main_prints_the_transcript_and_exits_0_when_the_stop_ended_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await example.amain() == 0
    out = capsys.readouterr().out
    assert "the model read:\n  1. order A-1: shipped\n" in out
    assert "stop notice (" in out and "scope run:run_" in out
    assert "finished: stopped by stp_" in out
    assert "the SDK raised" not in out


async def test_main_stream_prints_the_cut_stream(capsys: pytest.CaptureFixture[str]) -> None:
    assert await example.amain(["--stream"]) == 0
    out = capsys.readouterr().out
    assert "stop notice (model stream (cut at the gateway)): stopped stp_" in out
    assert "the SDK raised: openai.APIError mid-stream, code stopped stop_id stp_" in out
    assert "it saw its connection close" in out
    assert "run report: model:fake-model cancellable cancelled by stp_" in out


async def test_a_stop_mid_stream_ends_a_streamed_run_by_the_gateway_cutting_the_model_stream(
    tmp_path: Path,
) -> None:
    # Runner.run_streamed: the model streams each turn; its 4th stream holds open after its first
    # events. The operator stops the run then: nothing in the agent's process can cancel a
    # stream that sends nothing, so only the gateway's cut can end this run (without it, the
    # scenario's deadline would).
    transcript = await example.scenario(tmp_path, stop_after=3, stream=True, deadline_s=30)
    notice = transcript.notice
    assert notice is not None, transcript.other_end
    stop_id = transcript.issued["stop_id"]
    scope = f"run:{transcript.run_id}"
    assert (notice.code, notice.stop_id, notice.scope, notice.reason) == ("stopped", stop_id, scope, REASON)
    assert transcript.ended_in == "model stream (cut at the gateway)"

    # What the SDK did: the gateway ended the stream with its error event, the openai client in
    # OpenAIResponsesModel raised it as an APIError (not a status error: the stream had begun
    # with a 200) whose body is the gateway's error object, and Runner.run_streamed's
    # stream_events() raised that (the example's model wrapper turns it into StopRequested).
    cut = transcript.cut
    assert type(cut) is openai.APIError, transcript.cut
    assert cut.body == {
        "message": cut.message,
        "type": "haltwire_refusal",
        "param": None,
        "code": "stopped",
        "retryable": False,
        "scope": scope,
        "stop_id": stop_id,
        "reason": REASON,
    }
    assert REASON in cut.message

    # The provider: 4 model calls, the 4th cut after the 4 events it had sent, its connection
    # closed; no model call, no tool call after the stop (one model call a turn, one tool call).
    assert transcript.provider_sent == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
    ]
    assert transcript.provider_saw_close
    assert transcript.model_calls_when_stopped == transcript.model_calls_at_exit == 4
    assert transcript.served_at_exit == 3 == len(transcript.calls)
    assert transcript.read == orders(3)
    # Every event the provider sent reached the agent: 8 for each of the 3 whole turns, then 4.
    assert transcript.events == 3 * 8 + 4

    # The run report records the cut model call.
    calls = [(c["tool"], c["label"], c["outcome"], c["stop_id"]) for c in transcript.report_calls]
    assert calls == [("model:fake-model", "cancellable", "cancelled", stop_id)]

    lines = transcript.lines()
    assert f"the SDK raised: openai.APIError mid-stream, code stopped stop_id {stop_id}" in lines
    assert f"run report: model:fake-model cancellable cancelled by {stop_id}" in lines
    assert lines[-1] == f"finished: stopped by {stop_id}: {REASON} after 3 tool calls"
