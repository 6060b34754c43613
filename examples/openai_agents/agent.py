"""An OpenAI Agents SDK agent under haltwire: a runaway run, stopped by an operator mid-run.

Everything runs in this process on loopback: a control plane (SQLite in a temporary
directory), the demo upstream, a gateway in front of it that requires a lease from the
agent, and a scripted fake of the Responses API (``fake_model.py``) behind the same gateway
(``[[models]]``), so no request leaves the machine and no real model is called.

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

Run: ``.venv/bin/python -m examples.openai_agents.agent`` (exit 0 when the stop ended the run).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
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
from openai import APIStatusError, AsyncOpenAI

from haltwire.control import create_app, parse_control_config
from haltwire.demo.stack import connect, demo_config, running_gateway, running_upstream
from haltwire.demo.upstream import DemoUpstream
from haltwire.runtime import ControlClient, Guard, Lease, LeasedTools, StopNotice, StopRequested
from haltwire.serve import serving

if __package__ in (None, ""):  # run as a file: make ``examples.openai_agents`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.openai_agents.fake_model import FakeResponses

OPERATOR_TOKEN = "tok-oncall"
GATEWAY_TOKEN = "tok-gateway"
#: The runtime's identity at the control plane; the same agent, tenant and version as the
#: gateway's ops-bot, so the gateway accepts this run's leases from ops-bot's calls.
RUNTIME_TOKEN = "tok-ops-runtime"
MCP_TOKEN = "tok-ops"
LEASE_SECRET = "example-lease-key-" + "x" * 32
#: The fake provider's key, which only the gateway holds (read from this variable at its start).
MODEL_KEY_ENV = "HALTWIRE_EXAMPLE_MODEL_KEY"
REASON = "refund storm: the agent keeps looking up orders"

#: The refusals from the gateway that mean this run is over, not this one call.
RUN_OVER = frozenset({"stopped", "lease_expired", "lease_invalid"})


def control_config(db: Path) -> dict[str, Any]:
    return {
        "control": {"development": True, "heartbeat_s": 1.0},
        "registry": {"backend": "sqlite", "path": str(db)},
        "agent_classes": {"default": {"ttl_s": 15, "renew_every_s": 5, "renew_timeout_s": 10}},
        "leases": {"signing_key": "k1", "keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        "identities": [
            {"name": "oncall", "role": "operator", "token": OPERATOR_TOKEN},
            {"name": "gateway-1", "role": "gateway", "token": GATEWAY_TOKEN},
            {
                "name": "ops-runtime",
                "role": "agent",
                "token": RUNTIME_TOKEN,
                "agent": "ops-bot",
                "tenant": "acme",
                "version": "1.0",
            },
        ],
    }


def gateway_config(upstream: str, control: str, model: str) -> dict[str, Any]:
    data = demo_config(
        upstream,
        control={"url": control, "token": GATEWAY_TOKEN, "staleness_s": 2.0},
        leases={"keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        models=[{"name": "fake", "base_url": f"{model}/v1", "api_key_env": MODEL_KEY_ENV, "models": ["fake-model"]}],
    )
    data["identities"][0]["lease"] = "required"  # ops-bot: no lease, no tool call
    return data


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
        out.append(f"finished: {self.finished()}")
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
        # Streaming is checked between events only; this example runs non-streaming.
        self.guard.lease.require()
        async for event in self.inner.stream_response(*args, **kwargs):
            yield event
            self.guard.lease.require()

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
    """Run the agent until it ends; record why in ``transcript``."""
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
    try:
        result = await Runner.run(
            agent,
            "Check the status of every order.",
            hooks=LeaseHooks(lease, transcript),
            max_turns=1000,
            run_config=RunConfig(tracing_disabled=True),
        )
        transcript.other_end = f"final output {result.final_output!r}"
    except Exception as exc:
        transcript.notice = stop_notice_in(exc)
        if transcript.notice is None:
            transcript.other_end = f"{type(exc).__name__}: {exc}"
            raise
    finally:
        await openai.close()
        await http.aclose()


async def operator_stop(control_url: str, scope: str, reason: str) -> dict[str, Any]:
    """``POST /v1/stops`` as the operator would (``haltwire stop`` does the same)."""
    async with httpx2.AsyncClient(base_url=control_url, timeout=10) as http:
        r = await http.post(
            "/v1/stops",
            json={"scope": scope, "reason": reason},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
    r.raise_for_status()
    issued: dict[str, Any] = r.json()
    return issued


@dataclass
class Stack:
    control_url: str
    demo: DemoUpstream
    mcp_url: str
    model: FakeResponses
    #: The gateway's base URL: its model endpoints are under ``/v1``.
    gateway_url: str


@asynccontextmanager
async def running_stack(workdir: Path, *, think_s: float) -> AsyncIterator[Stack]:
    """Control plane, demo upstream, gateway (lease required) and fake model, on loopback."""
    app = create_app(parse_control_config(control_config(workdir / "control.db")))
    model = FakeResponses(think_s=think_s)
    os.environ.setdefault(MODEL_KEY_ENV, "fake-provider-key")
    async with (
        serving(app, graceful_s=1) as control_url,
        running_upstream() as (demo, upstream_url),
        serving(model.app()) as model_url,
        running_gateway(gateway_config(upstream_url, control_url, model_url)) as (_, mcp_url),
    ):
        yield Stack(control_url, demo, mcp_url, model, mcp_url.removesuffix("/mcp"))


async def scenario(
    workdir: Path, *, stop_after: int = 3, think_s: float = 0.2, push: bool = True
) -> Transcript:
    """Run the agent; the operator stops the run once ``stop_after`` calls reached the upstream.

    ``push=False`` leaves the run's lease to its renewals (every 5 s), so the stop reaches the
    run first as the gateway's refusal of its next call (level 3).
    """
    set_tracing_disabled(True)  # nothing is exported anywhere
    transcript = Transcript()
    async with running_stack(workdir, think_s=think_s) as stack:
        served = stack.demo.served
        async with (
            ControlClient(stack.control_url, RUNTIME_TOKEN) as control,
            Lease.start(control, tools=["lookup_order"], push=push) as lease,
            connect(stack.mcp_url, MCP_TOKEN) as mcp,
        ):
            transcript.run_id = lease.run_id

            async def operator() -> None:
                while served["lookup_order"] < stop_after:  # noqa: ASYNC110 - the upstream keeps counters, not events
                    await anyio.sleep(0.01)
                scope = f"run:{lease.run_id}"
                transcript.issued = await operator_stop(stack.control_url, scope, REASON)

            witnessing = anyio.CancelScope()

            async def witness() -> None:
                with witnessing:
                    await lease.ended.wait()
                    transcript.served_when_stopped = served["lookup_order"]

            with anyio.fail_after(60):  # a runaway that no stop reaches must not hang
                async with anyio.create_task_group() as tg:
                    tg.start_soon(operator)
                    tg.start_soon(witness)
                    await run_agent(lease, mcp, stack.gateway_url, transcript)
                    witnessing.cancel()
                    if transcript.served_when_stopped is None and transcript.notice is not None:
                        transcript.served_when_stopped = served["lookup_order"]  # refused at the gateway
                    if transcript.notice is None:
                        tg.cancel_scope.cancel()  # no stop reached the run: nothing left to witness
                    # else the operator's request may still be on its way back: let it land.
        await anyio.sleep(0.2)  # anything still on its way to the upstream would land by now
        transcript.read = list(stack.model.read)
        transcript.served_at_exit = served["lookup_order"]
    return transcript


async def amain() -> int:
    with tempfile.TemporaryDirectory(prefix="haltwire-openai-agents-") as tmp:
        transcript = await scenario(Path(tmp))
    print("\n".join(transcript.lines()))
    return 0 if transcript.stopped_by_issued_stop else 1


def main() -> int:
    return anyio.run(amain)


if __name__ == "__main__":
    sys.exit(main())
