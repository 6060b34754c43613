"""Issue 12, point 1: a run's stops cannot be bypassed by leaving the lease off.

With ``[leases]`` at the gateway, a call without a lease token has no run, so a ``run:`` stop,
the fence, ``run_steps`` and ``[[intent_limits]]`` cannot apply to it. Such calls from an agent
identity are refused ``lease_invalid`` unless the identity says ``lease = "optional"``. Real
control plane, shop, gateway and executor (``refunds_harness``), real MCP clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from haltwire.demo.refunds_stack import AGENT, PER_RUN
from haltwire.demo.shop import ORDERS
from haltwire.demo.support_agent import TOOLS
from haltwire.gateway.leases import LeaseCheck
from haltwire.identity import Identity
from haltwire.meta import LEASE_META
from haltwire.refusal import Refusal
from haltwire.runtime import ControlClient, Lease
from haltwire.tokens import LeaseKeys
from harness import connect
from refunds_harness import TOKENS, RefundsStack, refunds_stack

pytestmark = pytest.mark.anyio

ORDER_IDS = sorted(ORDERS)


def default_lease(data: dict[str, Any]) -> None:
    """The support agent's identity as a config that says nothing of leases declares it."""
    for identity in data["identities"]:
        identity.pop("lease", None)


def optional_lease(data: dict[str, Any]) -> None:
    for identity in data["identities"]:
        identity["lease"] = "optional"


async def refund(client: Client, order: str, lease: str | None) -> dict[str, Any]:
    """One refund call: its ``structuredContent`` (the intent, or the refusal's error)."""
    meta = {LEASE_META: lease} if lease is not None else None
    result = await client.call_tool("issue_refund", {"order_id": order, "amount_cents": 100}, meta=meta)  # type: ignore[arg-type]
    content: dict[str, Any] = result.structured_content or {}
    return content


async def settled(stack: RefundsStack, within: float = 15.0) -> list[dict[str, Any]]:
    """The intents once none is left for the executor (pending, claimed or unknown)."""
    with anyio.fail_after(within):
        while True:
            found = await stack.intents()
            if not any(i["state"] in ("pending", "claimed", "unknown") for i in found):
                return found
            await anyio.sleep(0.05)


async def test_seven_lease_less_refunds_are_refused_not_committed_past_the_per_run_limit(
    tmp_path: Path,
) -> None:
    """The defect: seven refunds without a lease all became intents with no run, so the per-run
    limit of five never counted them and the executor committed all seven."""
    async with (
        refunds_stack(tmp_path, gateway=default_lease) as stack,
        ControlClient(stack.control_url, TOKENS["runtime"]) as control,
        Lease.start(control, agent_class="support", tools=TOOLS),  # the agent has a run; it sends no lease
        connect(stack.gateway_url, TOKENS["agent"]) as client,
    ):
        answers = [await refund(client, order, lease=None) for order in ORDER_IDS[:7]]
        intents = await settled(stack)
        applied = stack.shop.ledger()["applied"]
    assert (applied, len(intents)) == (0, 0), f"{applied} refunds applied past a per-run limit of {PER_RUN}"
    for answer in answers:
        error = answer["error"]
        assert (error["code"], error["retryable"]) == ("lease_invalid", False)
        # The sentence names the fix, for whoever reads the agent's log.
        assert "lease" in error["message"] and 'lease = "optional"' in error["message"]


async def test_with_its_lease_the_same_agent_is_capped_at_the_per_run_limit(tmp_path: Path) -> None:
    async with (
        refunds_stack(tmp_path, gateway=default_lease) as stack,
        ControlClient(stack.control_url, TOKENS["runtime"]) as control,
        Lease.start(control, agent_class="support", tools=TOOLS, push=False) as lease,
        connect(stack.gateway_url, TOKENS["agent"]) as client,
    ):
        for order in ORDER_IDS[:7]:
            await refund(client, order, lease.token)
            await settled(stack)  # one at a time, as the demo's agent waits for each outcome
        intents = await settled(stack)
        applied = stack.shop.ledger()["applied"]
    assert applied == PER_RUN
    assert sorted(i["state"] for i in intents).count("committed") == PER_RUN
    assert all(i["run_id"] == lease.run_id for i in intents)


async def test_a_run_stop_reaches_a_lease_less_call_only_as_a_refusal(tmp_path: Path) -> None:
    """The defect: a ``run:`` stop refused the run's calls with its lease, and served the same
    agent's calls without one."""
    async with (
        refunds_stack(tmp_path, gateway=default_lease, executor=False) as stack,
        ControlClient(stack.control_url, TOKENS["runtime"]) as control,
        Lease.start(control, agent_class="support", tools=TOOLS, push=False) as lease,
        connect(stack.gateway_url, TOKENS["agent"]) as client,
        httpx2.AsyncClient(base_url=stack.control_url, timeout=10) as http,
    ):
        operator = {"Authorization": f"Bearer {TOKENS['operator']}"}
        stop = {"scope": f"run:{lease.run_id}", "reason": "refund storm"}
        assert (await http.post("/v1/stops", json=stop, headers=operator)).status_code == 201

        async def code(meta: dict[str, Any] | None) -> str | None:
            result = await client.call_tool("read_order", {"order_id": "A-1001"}, meta=meta)  # type: ignore[arg-type]
            return None if not result.is_error else str((result.structured_content or {})["error"]["code"])

        with anyio.fail_after(5):
            while await code({LEASE_META: lease.token}) != "stopped":
                await anyio.sleep(0.05)
        assert await code(None) == "lease_invalid", "the stopped run's agent, without its lease"


async def test_lease_optional_is_the_explicit_opt_out(tmp_path: Path) -> None:
    async with (
        refunds_stack(tmp_path, gateway=optional_lease, executor=False) as stack,
        connect(stack.gateway_url, TOKENS["agent"]) as client,
    ):
        answer = await refund(client, ORDER_IDS[0], lease=None)
        intents = await stack.intents()
    assert answer["intent"]["state"] == "pending", answer
    assert [(i["agent"], i["run_id"]) for i in intents] == [(AGENT, None)]


def test_the_opt_out_is_a_list_of_exceptions_so_an_identity_from_elsewhere_needs_a_lease() -> None:
    """An identity the gateway learns of outside its config table (an identity provider's, say)
    is not on the opt-out list: its lease-less call is refused, not served in no run."""
    check = LeaseCheck(LeaseKeys({"k1": b"k" * 40}, signing="k1"), optional=[("billing-bot", "acme", "2.0")])
    refused = check.check(Identity("issued-bot", "acme", "3.0"), None, None)
    assert isinstance(refused, Refusal) and refused.code == "lease_invalid"
    assert check.check(Identity("billing-bot", "acme", "2.0"), None, None) is None
