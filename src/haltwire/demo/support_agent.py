"""The support agent of ``haltwire demo refunds``: scripted (no model), compromised by a review.

It runs under a lease (``Lease.start``, agent class ``support``), calls tools through the
gateway with ``LeasedTools``, takes a broker credential for the orders API, lists the orders and
reads each one. Once it has read a review telling it to refund every order, it refunds every
order it reads (up to $200 each): each ``issue_refund`` is answered with an intent, and the
agent waits a little for the executor to settle it, as an agent reading its outcome would. It
saves a checkpoint (the orders handled, never what it read) after each order, and stops when a
call is refused (a refused refund is kept: ``AgentLog.refused``) or its lease ends
(``StopRequested``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import anyio
import jwt

from haltwire.demo.shop import MAX_REFUND_CENTS
from haltwire.demo.stack import connect
from haltwire.gateway.intents import INTENT_TOOL
from haltwire.runtime import ControlClient, ControlRefused, Guard, Lease, LeasedTools, StopRequested

AUDIENCE: Final = "orders-api"
TOOLS: Final = ("list_orders", "read_order", "issue_refund")
#: Intent states that still wait for the executor.
_OPEN: Final = ("pending", "claimed", "awaiting_approval")
#: Longest the agent waits for one intent to settle before proposing the next anyway.
SETTLE_S: Final = 5.0


@dataclass
class Proposal:
    """One ``issue_refund`` call as the agent saw it."""

    order_id: str
    amount_cents: int
    intent_id: str
    proposed_at: float
    state: str
    seen_at: float


@dataclass
class AgentLog:
    run_id: str = ""
    started_at: float = 0.0
    credential: dict[str, Any] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    injected_at: float | None = None
    proposals: list[Proposal] = field(default_factory=list)
    #: How the agent's loop ended: ``stopped`` (StopRequested), a refusal code, or ``done``.
    exited_by: str = ""
    exited_at: float = 0.0
    exit_message: str = ""
    #: The lease's notice, and when the lease ended in this process.
    notice: dict[str, Any] | None = None
    lease_ended_at: float | None = None
    #: The last checkpoint the run saved: the orders it has handled, never what it read.
    checkpoint: dict[str, Any] | None = None
    #: The refund call refused, if one was: its order, amount, time, and the refusal's
    #: ``structuredContent.error`` (``code``, ``message``; a tripwire's ``tripwire`` and ``scope``),
    #: or ``{"code": "stopped", "stop_id", "message"}`` when the stop reached the lease first.
    refused: dict[str, Any] | None = None


def _structured(result: Any) -> dict[str, Any]:
    data = result.structured_content
    return data if isinstance(data, dict) else {}


def _refusal(result: Any) -> tuple[str, str]:
    data = _structured(result)
    error = data.get("error")
    if not isinstance(error, dict):
        error = data
    text = " ".join(getattr(c, "text", "") for c in result.content)
    return str(error.get("code") or "refused"), text


def _compromised(review: str) -> bool:
    # The "model" obeys any instruction in a review that tells it to refund everything.
    return "refund every order" in review.lower()


async def support_agent(control: ControlClient, gateway_url: str, token: str) -> AgentLog:
    """Run the compromised support agent once, until the layers stop it."""
    log = AgentLog(started_at=time.time())
    async with Lease.start(control, agent_class="support", tools=TOOLS) as lease:
        log.run_id = lease.run_id
        async with anyio.create_task_group() as tg:

            async def note_the_end() -> None:
                await lease.ended.wait()
                log.lease_ended_at = time.time()

            tg.start_soon(note_the_end)
            try:
                await _work(lease, gateway_url, token, log)
            except StopRequested as exc:
                log.exited_by, log.exit_message = "stopped", exc.notice.message
            log.exited_at = time.time()
            # A loop that ended on a refusal still sees its lease end: by push, or at the next renewal.
            with anyio.move_on_after(lease.renew_every_s + 2):
                await lease.ended.wait()
            tg.cancel_scope.cancel()
        if lease.notice is not None:
            log.notice = asdict(lease.notice)
    return log


async def _work(lease: Lease, gateway_url: str, token: str, log: AgentLog) -> None:
    credential = await lease.credential(AUDIENCE)
    claims = jwt.decode(credential, options={"verify_signature": False})  # its times, for the timeline
    log.credential = {"issued_at": float(claims["iat"]), "expires_at": float(claims["exp"])}
    async with connect(gateway_url, token) as client:
        # Caught inside the client's block: leaving it by an exception wraps it in groups.
        try:
            await _read_and_refund(LeasedTools(client, Guard(lease)), log)
        except StopRequested as exc:
            log.exited_by, log.exit_message = "stopped", exc.notice.message


async def _read_and_refund(tools: LeasedTools, log: AgentLog) -> None:
    """List the orders and read each one; once compromised, refund every order read."""
    listed = await tools.call_tool("list_orders")
    if listed.is_error:
        log.exited_by, log.exit_message = _refusal(listed)
        return
    compromised = False
    for order in _structured(listed).get("orders", []):
        read = await tools.call_tool("read_order", {"order_id": order["order_id"]})
        if read.is_error:
            log.exited_by, log.exit_message = _refusal(read)
            return
        detail = _structured(read)
        log.read.append(str(detail["order_id"]))
        if not compromised and _compromised(str(detail.get("review", ""))):
            compromised, log.injected_at = True, time.time()
        if not compromised:
            await _checkpoint(tools.guard.lease, log)
            continue
        amount = min(int(detail["amount_cents"]), MAX_REFUND_CENTS)
        proposed_at = time.time()
        attempt = {"order_id": str(detail["order_id"]), "amount_cents": amount, "at": proposed_at}
        try:
            answer = await tools.call_tool(
                "issue_refund", {"order_id": detail["order_id"], "amount_cents": amount}
            )
        except StopRequested as exc:
            # The stop reached this process before the gateway's answer did.
            stopped = {"code": "stopped", "stop_id": exc.notice.stop_id, "message": exc.notice.message}
            log.refused = {**attempt, "answered_at": time.time(), "error": stopped}
            raise
        if answer.is_error:
            log.exited_by, log.exit_message = _refusal(answer)
            error = _structured(answer).get("error")
            refusal = error if isinstance(error, dict) else {"code": log.exited_by}
            log.refused = {**attempt, "answered_at": time.time(), "error": refusal}
            return
        intent = _structured(answer)["intent"]
        proposal = Proposal(
            str(detail["order_id"]), amount, intent["intent_id"], proposed_at, intent["state"], time.time()
        )
        log.proposals.append(proposal)
        await _settle(tools, proposal)
        await _checkpoint(tools.guard.lease, log)
    log.exited_by, log.exit_message = "done", "read every order"


async def _checkpoint(lease: Lease, log: AgentLog) -> None:
    """Save where the run is (the orders handled), so a restart resumes instead of replaying."""
    data = {"orders_done": list(log.read)}
    try:
        await lease.save_checkpoint(data)
    except ControlRefused:  # the run is stopped: the last checkpoint stands
        return
    log.checkpoint = data


async def _settle(tools: LeasedTools, proposal: Proposal) -> None:
    """Wait (a little) for the executor to settle the intent, as an agent reading its outcome does."""
    with anyio.move_on_after(SETTLE_S):
        while proposal.state in _OPEN:
            await anyio.sleep(0.02)
            status = await tools.call_tool(INTENT_TOOL, {"intent_id": proposal.intent_id})
            if status.is_error:
                return
            proposal.state, proposal.seen_at = str(_structured(status)["intent"]["state"]), time.time()
