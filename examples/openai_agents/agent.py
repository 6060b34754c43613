"""An OpenAI Agents SDK agent under haltwire: a runaway run, stopped by an operator mid-run.

Everything runs in this process on loopback: a control plane (SQLite in a temporary
directory), the demo upstream, a gateway in front of it that requires a lease from the
agent, and a scripted fake of the Responses API (``fake_model.py``) behind the same gateway
(``[[models]]``), so no request leaves the machine and no real model is called
(``stack.py`` starts them).

The agent is a plain ``Agent`` + ``Runner``. haltwire sits at four places:

- the run holds a lease (``Lease.start``); the watch pushes a stop to it;
- the model is wrapped in ``GuardedModel``: each model call runs under ``Guard``, so a stop
  cancels a model call in flight; ``LeaseHooks.on_llm_start`` also checks the lease first;
- the one tool, ``lookup_order``, is a function tool whose body calls the gateway through
  ``LeasedTools`` (our own MCP client), so every ``tools/call`` carries the lease and runs
  under the guard; the gateway verifies the lease on its own, too;
- the model calls go through the gateway too (its ``/v1/responses``): the agent's key is its
  haltwire token, each call carries the lease (``Haltwire-Lease``), and the gateway refuses a
  stopped run's model call (403 ``stopped``) or cuts the one in flight, whatever the runtime does.

The fake model asks for ``lookup_order`` on A-1, A-2, ... forever. After ``stop_after``
calls have reached the upstream, the operator issues a stop on ``run:RUN_ID``; the run ends
with ``StopRequested`` and the example prints what the model read and how the run finished.

With ``--stream`` the run is streamed (``Runner.run_streamed``, ``stream: true`` through the
gateway), and the stop lands while the model is streaming: the gateway cuts the stream, the
SDK raises its last event as ``openai.APIError`` out of ``stream_events()``, and the run report
lists the cut model call (see the README).

Run: ``.venv/bin/python -m examples.openai_agents.agent [--stream]`` (exit 0 when the stop
ended the run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelResponse,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    TResponseInputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesModel
from mcp import Client
from openai import APIError, APIStatusError, AsyncOpenAI

from haltwire.demo.stack import connect
from haltwire.runtime import ControlClient, Guard, Lease, LeasedTools, StopNotice, StopRequested

if __package__ in (None, ""):  # run as a file: make ``examples.openai_agents`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.openai_agents.fake_model import FakeResponses
from examples.openai_agents.stack import (
    MCP_TOKEN,
    REASON,
    RUNTIME_TOKEN,
    operator_stop,
    reported_calls,
    running_stack,
)

#: The refusals from the gateway that mean this run is over, not this one call.
RUN_OVER = frozenset({"stopped", "lease_expired", "lease_invalid"})


@dataclass
class Transcript:
    run_id: str = ""
    #: Each tool result the model read, as the fake Responses endpoint received it.
    read: list[str] = field(default_factory=list)
    #: The tool calls that returned to the agent, as ``name(arguments) -> result``.
    calls: list[str] = field(default_factory=list)
    #: The stop the operator issued (its ``stop_id``, ``scope``, ``reason``).
    issued: dict[str, Any] = field(default_factory=dict)
    #: Why the run ended, as the runtime SDK reported it.
    notice: StopNotice | None = None
    #: Where the stop reached the run: "model call" or "tool call".
    ended_in: str = ""
    #: Calls the upstream had served when the stop reached the run (its lease ended, or the
    #: gateway refused it), and when everything was over.
    served_when_stopped: int | None = None
    served_at_exit: int = 0
    #: The run's end when no stop ended it (a final output, or another error).
    other_end: str = ""
    #: Model calls the provider had got when the run ended, and when everything was over.
    model_calls_when_stopped: int | None = None
    model_calls_at_exit: int = 0
    #: Streamed (``Runner.run_streamed``): the model's stream events that reached the agent.
    streamed: bool = False
    events: int = 0
    #: What the Agents SDK raised when the gateway cut the model's stream: ``openai.APIError``,
    #: its ``body`` the gateway's error object naming the stop.
    cut: APIError | None = None
    #: Seconds from the operator sending the stop to the run's end.
    stop_to_end_s: float | None = None
    #: The cut stream at the provider: the events it had sent, and whether it saw the close.
    provider_sent: list[str] = field(default_factory=list)
    provider_saw_close: bool = False
    #: The calls the stop found in flight, from the run report (``GET /v1/runs/{id}/report``).
    report_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stopped_by_issued_stop(self) -> bool:
        return self.notice is not None and self.notice.stop_id == self.issued.get("stop_id")

    def finished(self) -> str:
        if self.notice is None:
            return f"not stopped: {self.other_end}"
        by = self.notice.stop_id or self.notice.code
        return (
            f"stopped by {by}: {self.notice.reason or self.notice.message} after {len(self.calls)} tool calls"
        )

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}", "the model read:"]
        out += [f"  {i}. {text}" for i, text in enumerate(self.read, 1)] or ["  (nothing)"]
        if self.issued:
            out.append(
                f"operator: stop {self.issued['stop_id']} on {self.issued['scope']}: {self.issued['reason']}"
            )
        if self.notice is not None:
            n = self.notice
            out.append(f"stop notice ({self.ended_in}): {n.code} {n.stop_id} scope {n.scope}: {n.reason}")
        out.append(
            f"upstream: {self.served_when_stopped} calls served when the stop reached the run, {self.served_at_exit} in all"
        )
        if self.streamed:
            out += self.stream_lines()
        out.append(f"finished: {self.finished()}")
        return out

    def stream_lines(self) -> list[str]:
        out = [f"model: {self.events} stream events reached the agent"]
        if self.cut is not None:
            body = self.cut.body if isinstance(self.cut.body, dict) else {}
            out.append(f"the SDK raised: openai.APIError mid-stream, code {body.get('code')} stop_id {body.get('stop_id')}")
        if self.stop_to_end_s is not None:
            out.append(f"the run ended {self.stop_to_end_s * 1000:.0f} ms after the operator sent the stop")
        close = "saw its connection close" if self.provider_saw_close else "did not see its connection close"
        last = self.provider_sent[-1] if self.provider_sent else "nothing"
        out.append(f"provider: the cut stream had sent {len(self.provider_sent)} events (last {last}); it {close}")
        out.append(
            f"provider: {self.model_calls_when_stopped} model calls when the run ended, {self.model_calls_at_exit} in all"
        )
        out += [
            f"run report: {c['tool']} {c['label']} {c['outcome']} by {c['stop_id']}" for c in self.report_calls
        ] or ["run report: no call cut"]
        return out


class GuardedModel(Model):
    """A model whose every call runs under the guard: a stop cancels the call in flight."""

    def __init__(self, inner: Model, guard: Guard, transcript: Transcript) -> None:
        self.inner = inner
        self.guard = guard
        self.transcript = transcript

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def call(token: str) -> ModelResponse:
            return await self.inner.get_response(*args, **kwargs)

        try:
            return await self.guard.call(call)
        except StopRequested:
            self.transcript.ended_in = self.transcript.ended_in or "model call"
            raise
        except APIStatusError as exc:
            error = exc.body if isinstance(exc.body, dict) else {}
            if error.get("code") not in RUN_OVER:
                raise
            # Level 3: the gateway refused the model call before this process saw the stop.
            self.transcript.ended_in = self.transcript.ended_in or "model call (refused at the gateway)"
            raise StopRequested(StopNotice.from_error(error)) from exc

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # Checked between events only: a stream that holds open is the gateway's to cut.
        self.guard.lease.require()
        try:
            async for event in self.inner.stream_response(*args, **kwargs):
                yield event
                try:
                    self.guard.lease.require()
                except StopRequested:
                    self.transcript.ended_in = self.transcript.ended_in or "model stream"
                    raise
        except APIError as exc:
            error = exc.body if isinstance(exc.body, dict) else {}
            if error.get("code") not in RUN_OVER:
                raise
            if isinstance(exc, APIStatusError):  # refused before it began: a 403
                self.transcript.ended_in = self.transcript.ended_in or "model call (refused at the gateway)"
            else:
                # The gateway cut the stream: its last event, an error event, which the openai
                # client raises as an APIError (no status: the stream had begun with a 200).
                self.transcript.cut = exc
                self.transcript.ended_in = self.transcript.ended_in or "model stream (cut at the gateway)"
            raise StopRequested(StopNotice.from_error(error)) from exc

    async def close(self) -> None:
        await self.inner.close()


class LeaseHooks(RunHooks[Any]):
    """Level 1 before each turn: no model call starts once the lease has ended."""

    def __init__(self, lease: Lease, transcript: Transcript) -> None:
        self.lease = lease
        self.transcript = transcript

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        try:
            self.lease.require()
        except StopRequested:
            # The push arrived between two turns: the next model call is never started.
            self.transcript.ended_in = self.transcript.ended_in or "before a model call"
            raise


def order_tool(tools: LeasedTools, transcript: Transcript) -> FunctionTool:
    """``lookup_order`` as a function tool whose body goes through the gateway under the lease."""

    # failure_error_function=None: a StopRequested ends the run instead of becoming a
    # message the model reads and works around.
    @function_tool(failure_error_function=None)
    async def lookup_order(order_id: str) -> str:
        """Read one order by id.

        Args:
            order_id: The order's id, such as A-1.
        """
        try:
            result = await tools.call_tool("lookup_order", {"order_id": order_id})
        except StopRequested:
            transcript.ended_in = transcript.ended_in or "tool call"
            raise
        error = (result.structured_content or {}).get("error") if result.is_error else None
        if isinstance(error, dict) and error.get("code") in RUN_OVER:
            # Level 3: the gateway refused the lease before this process saw the stop.
            transcript.ended_in = transcript.ended_in or "tool call (refused at the gateway)"
            raise StopRequested(StopNotice.from_error(error))
        text = "\n".join(getattr(c, "text", "") for c in result.content)
        transcript.calls.append(f"lookup_order({order_id!r}) -> {text}")
        return text

    return lookup_order


def stop_notice_in(exc: BaseException) -> StopNotice | None:
    """The ``StopRequested`` notice behind ``exc``: the Runner wraps a tool's exception."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, StopRequested):
            return e.notice
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return None


async def run_agent(lease: Lease, mcp: Client, gateway_url: str, transcript: Transcript) -> None:
    """Run the agent until it ends (streamed when ``transcript.streamed``); record why in ``transcript``."""
    guard = Guard(lease)

    async def with_lease(request: httpx2.Request) -> None:
        request.headers["Haltwire-Lease"] = lease.token  # the current one: renewals replace it

    # The gateway is the model endpoint; the agent's key is its haltwire token, not a provider's.
    http = httpx2.AsyncClient(event_hooks={"request": [with_lease]}, timeout=60)
    openai = AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=MCP_TOKEN, max_retries=0, http_client=http)
    model = GuardedModel(OpenAIResponsesModel("fake-model", openai), guard, transcript)
    agent = Agent(
        name="ops-bot",
        instructions="Check every order, one at a time.",
        model=model,
        tools=[order_tool(LeasedTools(mcp, guard), transcript)],
    )
    task = "Check the status of every order."
    hooks, config = LeaseHooks(lease, transcript), RunConfig(tracing_disabled=True)
    try:
        if transcript.streamed:
            streamed = Runner.run_streamed(agent, task, hooks=hooks, max_turns=1000, run_config=config)
            try:
                # A model call's exception, a cut stream's included, is raised here.
                async for event in streamed.stream_events():
                    transcript.events += event.type == "raw_response_event"
            finally:
                streamed.cancel()  # a no-op once the run has ended; else (this task cancelled) ends it
            transcript.other_end = f"final output {streamed.final_output!r}"
        else:
            result = await Runner.run(agent, task, hooks=hooks, max_turns=1000, run_config=config)
            transcript.other_end = f"final output {result.final_output!r}"
    except Exception as exc:
        transcript.notice = stop_notice_in(exc)
        if transcript.notice is None:
            transcript.other_end = f"{type(exc).__name__}: {exc}"
            raise
    finally:
        await openai.close()
        await http.aclose()


async def scenario(
    workdir: Path,
    *,
    stop_after: int = 3,
    think_s: float = 0.2,
    push: bool = True,
    stream: bool = False,
    deadline_s: float = 60.0,
) -> Transcript:
    """Run the agent; the operator stops the run once ``stop_after`` calls reached the upstream.

    ``push=False`` leaves the run's lease to its renewals (every 5 s), so the stop reaches the
    run first as the gateway's refusal of its next call (level 3).

    ``stream=True`` runs it streamed (``Runner.run_streamed``): the model streams each turn, and
    its stream of turn ``stop_after + 1`` holds open after its first events, as a model does
    while it generates; the operator stops the run then, mid-stream, and the gateway cuts the
    stream (nothing in this process cancels a model stream that sends nothing).
    """
    set_tracing_disabled(True)  # nothing is exported anywhere
    transcript = Transcript(streamed=stream)
    model = FakeResponses(event_s=0.01, hold_turn=stop_after + 1) if stream else FakeResponses(think_s=think_s)
    issued_at = ended_at = 0.0
    async with running_stack(workdir, model) as stack:
        served = stack.demo.served
        async with (
            ControlClient(stack.control_url, RUNTIME_TOKEN) as control,
            Lease.start(control, tools=["lookup_order"], push=push) as lease,
            connect(stack.mcp_url, MCP_TOKEN) as mcp,
        ):
            transcript.run_id = lease.run_id

            async def operator() -> None:
                nonlocal issued_at
                if stream:
                    await model.holding.wait()  # the model is streaming its answer
                while served["lookup_order"] < stop_after:  # noqa: ASYNC110 - the upstream keeps counters, not events
                    await anyio.sleep(0.01)
                scope = f"run:{lease.run_id}"
                issued_at = anyio.current_time()
                transcript.issued = await operator_stop(stack.control_url, scope, REASON)

            witnessing = anyio.CancelScope()

            async def witness() -> None:
                with witnessing:
                    await lease.ended.wait()
                    transcript.served_when_stopped = served["lookup_order"]

            with anyio.fail_after(deadline_s):  # a runaway that no stop reaches must not hang
                async with anyio.create_task_group() as tg:
                    tg.start_soon(operator)
                    tg.start_soon(witness)
                    await run_agent(lease, mcp, stack.gateway_url, transcript)
                    ended_at = anyio.current_time()
                    transcript.model_calls_when_stopped = model.answered
                    witnessing.cancel()
                    if transcript.served_when_stopped is None and transcript.notice is not None:
                        transcript.served_when_stopped = served["lookup_order"]  # refused at the gateway
                    if transcript.notice is None:
                        tg.cancel_scope.cancel()  # no stop reached the run: nothing left to witness
                    # else the operator's request may still be on its way back: let it land.
        await anyio.sleep(0.2)  # anything still on its way to the upstream would land by now
        transcript.read = list(model.read)
        transcript.served_at_exit = served["lookup_order"]
        transcript.model_calls_at_exit = model.answered
        if stream and (held := model.held) is not None:
            with anyio.move_on_after(5):
                await held.disconnected.wait()
            transcript.provider_sent = list(held.sent)
            transcript.provider_saw_close = held.disconnected.is_set()
            transcript.stop_to_end_s = ended_at - issued_at if transcript.issued else None
            transcript.report_calls = await reported_calls(stack.control_url, transcript.run_id)
    return transcript


async def amain(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.openai_agents.agent", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--stream", action="store_true", help="run streamed (Runner.run_streamed); the stop lands mid-stream"
    )
    args = parser.parse_args([] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="haltwire-openai-agents-") as tmp:
        transcript = await scenario(Path(tmp), stream=args.stream)
    print("\n".join(transcript.lines()))
    return 0 if transcript.stopped_by_issued_stop else 1


def main() -> int:
    return anyio.run(amain, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
