"""A scripted agent: a real MCP client that repeats one tool call and does what each answer says.

No model is called. The agent stands for a loop whose only judgement is the answer it
just got, which is what a refusal has to work against:

- a result that is not an error: the call was served, go on;
- an error whose ``structuredContent.error.retryable`` is false: stop (the server stopped it);
- an error that is retryable (``retryable: true``, or no structured error but words that say
  try again or retry): wait as told and send the call again;
- any other error: stop.

Whatever the answers say, the agent stops at its own step cap. ``read_answer`` and
``decide`` are pure functions, so the policy is testable without a server.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import anyio
from mcp import Client
from mcp.types import CallToolResult, TextContent

#: Words that invite another attempt, in an error that carries no structured ``retryable``.
RETRY_WORDS: Final = re.compile(r"\btry\s+again\b|\bretry", re.IGNORECASE)
#: The wait assumed when an error invites a retry without saying how long to wait.
DEFAULT_RETRY_AFTER_S: Final = 1.0
DEFAULT_MAX_STEPS: Final = 200

Action = Literal["served", "retry", "stop"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What one ``tools/call`` answered, reduced to what the agent acts on."""

    is_error: bool
    text: str = ""
    code: str | None = None
    retryable: bool | None = None
    retry_after_s: float | None = None

    @property
    def invites_retry(self) -> bool:
        """Whether the words (not the data) ask for another attempt."""
        return bool(RETRY_WORDS.search(self.text))

    def describe(self) -> str:
        """One line for a report: the code and flag when the data has them, else the words."""
        if not self.is_error:
            return "served"
        if self.code is None and self.retryable is None:
            return f'"{self.text}"'
        out = f"{self.code or '(no code)'}, retryable {_flag(self.retryable)}"
        if self.retryable and self.retry_after_s:
            out += f", retry after {self.retry_after_s:g}s"
        if self.invites_retry:
            out += f': "{self.text}"'
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "is_error": self.is_error,
            "text": self.text,
            "code": self.code,
            "retryable": self.retryable,
            "retry_after_s": self.retry_after_s,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    #: How long the answer says to wait before the retry (unscaled); 0 unless ``retry``.
    wait_s: float = 0.0
    reason: str = ""


def _flag(v: bool | None) -> str:
    return "unset" if v is None else str(v).lower()


def read_answer(result: CallToolResult) -> Answer:
    """Reduce a ``CallToolResult`` to an ``Answer``. Pure."""
    text = " ".join(c.text for c in result.content if isinstance(c, TextContent))
    if not result.is_error:
        return Answer(is_error=False, text=text)
    sc = result.structured_content
    error = sc.get("error") if isinstance(sc, dict) else None
    if not isinstance(error, dict):
        return Answer(is_error=True, text=text)
    code = error.get("code")
    retryable = error.get("retryable")
    after = error.get("retry_after_s")
    return Answer(
        is_error=True,
        text=text,
        code=code if isinstance(code, str) else None,
        retryable=retryable if isinstance(retryable, bool) else None,
        retry_after_s=float(after)
        if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0
        else None,
    )


def decide(answer: Answer) -> Decision:
    """What the scripted agent does next. Pure: the data decides first, then the words."""
    if not answer.is_error:
        return Decision("served", reason="served")
    if answer.retryable is False:
        return Decision("stop", reason="terminal error (retryable false)")
    if answer.retryable is True:
        wait = DEFAULT_RETRY_AFTER_S if answer.retry_after_s is None else answer.retry_after_s
        return Decision("retry", wait, "retryable error (retryable true)")
    if answer.invites_retry:
        return Decision("retry", DEFAULT_RETRY_AFTER_S, "error text says to try again")
    return Decision("stop", reason="error with no invitation to retry")


@dataclass(slots=True)
class AgentLog:
    """What one run of the agent did."""

    agent: str
    max_steps: int
    calls: int = 0
    served: int = 0
    refused: int = 0
    #: ``TypeName: message`` when the client raised instead of returning a result.
    raised: str | None = None
    last: Answer | None = None
    stopped_by: str = ""
    waited_s: float = 0.0
    codes: dict[str, int] = field(default_factory=dict)

    def describe_last(self) -> str:
        if self.raised is not None:
            return f"raised {self.raised}"
        return self.last.describe() if self.last is not None else "(no call made)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "max_steps": self.max_steps,
            "calls": self.calls,
            "served": self.served,
            "refused": self.refused,
            "raised": self.raised,
            "stopped_by": self.stopped_by,
            "last": self.last.to_dict() if self.last is not None else None,
            "waited_s": round(self.waited_s, 3),
            "codes": dict(self.codes),
        }


BeforeCall = Callable[[int], Awaitable[None]]


async def run_agent(
    client: Client,
    agent: str,
    tool: str = "lookup_order",
    arguments: dict[str, Any] | None = None,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    wait_scale: float = 0.0,
    max_wait_s: float = 0.05,
    before_call: BeforeCall | None = None,
    meta: dict[str, Any] | None = None,
) -> AgentLog:
    """Repeat one call until the server stops the agent, the client raises, or ``max_steps``.

    A retry sleeps ``min(wait_s * wait_scale, max_wait_s)``: the default scale of 0 keeps a
    demo fast, since only the number of calls matters here. ``before_call(step)`` runs
    before each call (step 1 is the first), so a demo can flip a switch between calls.
    ``meta`` rides on every call (a lease token, say).
    """
    log = AgentLog(agent=agent, max_steps=max_steps)
    args = arguments if arguments is not None else {"order_id": "A-1"}
    for step in range(1, max_steps + 1):
        if before_call is not None:
            await before_call(step)
        log.calls += 1
        try:
            result = await client.call_tool(tool, args, meta=cast(Any, meta))
        except Exception as exc:
            log.raised = f"{type(exc).__name__}: {exc}"
            log.stopped_by = f"the client raising {type(exc).__name__}"
            return log
        answer = read_answer(result)
        log.last = answer
        decision = decide(answer)
        if decision.action == "served":
            log.served += 1
            continue
        log.refused += 1
        key = answer.code or "(text only)"
        log.codes[key] = log.codes.get(key, 0) + 1
        if decision.action == "stop":
            log.stopped_by = "the server"
            return log
        wait = min(decision.wait_s * wait_scale, max_wait_s)
        if wait > 0:
            log.waited_s += wait
            await anyio.sleep(wait)
    log.stopped_by = f"its own {max_steps}-step cap"
    return log


async def call_once(
    client: Client,
    tool: str = "lookup_order",
    arguments: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> Answer:
    """One call, its answer read as the agent reads it."""
    args = arguments if arguments is not None else {"order_id": "A-1"}
    result = await client.call_tool(tool, args, meta=cast(Any, meta))
    return read_answer(result)
