"""Refusal shapes and words, and the SDK behaviour that makes haltwire return refusals instead of raising."""

from __future__ import annotations

import re
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from haltwire import refusal
from haltwire.demo.stack import connect
from haltwire.refusal import TERMINAL_CODES, TRANSIENT_CODES, Refusal
from haltwire.serve import serving

# One builder per code, with arguments; the test below insists every terminal code is here.
BUILT: dict[str, Refusal] = {
    "budget_exhausted": refusal.budget_exhausted("ops-bot", 20, 1_800_003_600),
    "agent_suspended": refusal.agent_suspended("ops-bot"),
    "stopped": refusal.stopped("tenant:acme", "stp_1", "refund storm"),
    "lease_expired": refusal.lease_expired("run-1"),
    "lease_invalid": refusal.lease_invalid("bad signature"),
    "policy_denied": refusal.policy_denied("ops-bot", "refund"),
    "tripwire_tripped": refusal.tripwire_tripped("refunds-per-run", "run-1"),
    "deadline_exceeded": refusal.deadline_exceeded("refund", 30),
    "unauthenticated": refusal.unauthenticated("no bearer token was sent"),
    "idempotency_conflict": refusal.idempotency_conflict("refund-4711"),
    "outcome_unknown": refusal.outcome_unknown("refund", "refund-4711"),
    "too_many_in_flight": refusal.too_many_in_flight("ops-bot", 2),
    "counters_unavailable": refusal.counters_unavailable(),
    "upstream_unavailable": refusal.upstream_unavailable("demo"),
    "registry_unreachable": refusal.registry_unreachable(),
}
FORBIDDEN = re.compile(r"try again|retry|later", re.IGNORECASE)


def test_every_code_has_a_builder() -> None:
    assert set(BUILT) == TERMINAL_CODES | TRANSIENT_CODES
    assert {code for code, r in BUILT.items() if r.code != code} == set()


@pytest.mark.parametrize("code", sorted(TERMINAL_CODES))
def test_terminal_refusals_tell_the_agent_to_stop_and_never_invite_a_retry(code: str) -> None:
    r = BUILT[code]
    assert r.retryable is False
    assert r.retry_after_s is None
    assert not FORBIDDEN.search(r.message), r.message
    assert "stop calling tools" in r.message and "the task is incomplete" in r.message
    assert r.message.count(".") == 1 and r.message.endswith("."), "one sentence"


@pytest.mark.parametrize("code", sorted(TRANSIENT_CODES))
def test_transient_refusals_say_how_long_to_wait(code: str) -> None:
    r = BUILT[code]
    assert r.retryable is True
    assert r.retry_after_s is not None and r.retry_after_s > 0
    assert r.resets_at is None


def test_the_tool_result_shape_matches_the_design() -> None:
    r = refusal.budget_exhausted("ops-bot", 20, 1_800_003_600)
    result = r.tool_result()
    assert result["isError"] is True
    assert result["content"] == [{"type": "text", "text": r.message}]
    assert result["structuredContent"] == {
        "error": {
            "code": "budget_exhausted",
            "message": r.message,
            "retryable": False,
            "resets_at": "2027-01-15T09:00:00Z",
        }
    }
    assert "2027-01-15T09:00:00Z" in r.message
    # It validates as an MCP CallToolResult.
    parsed = types.CallToolResult.model_validate(result)
    assert parsed.is_error and parsed.structured_content == result["structuredContent"]


def test_stopped_carries_scope_stop_id_and_reason() -> None:
    error = refusal.stopped("tool:refund", "stp_9", "refund storm").error()
    assert (error["scope"], error["stop_id"], error["reason"]) == ("tool:refund", "stp_9", "refund storm")


def test_http_statuses_at_the_edge() -> None:
    assert refusal.unauthenticated("x").http_status == 401
    assert refusal.agent_suspended("x").http_status == 403
    assert refusal.budget_exhausted("x", 1, 0).http_status == 429
    assert refusal.too_many_in_flight("x", 1).http_status == 429
    assert refusal.counters_unavailable().http_status == 503
    assert refusal.payload_too_large(10).http_status == 413


# The SDK behaviour haltwire is built around: a raised error loses structuredContent.


@pytest.mark.anyio
async def test_a_raised_error_reaches_the_client_as_an_exception_not_a_tool_result() -> None:
    """Over real HTTP: a raised MCPError makes the client raise (no result for the model to read),
    and any other exception loses its words entirely."""
    data = refusal.budget_exhausted("ops-bot", 20, 1_800_003_600).error()

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "protocol_error":
            raise MCPError(code=-32000, message=data["message"], data={"error": data})
        raise RuntimeError(data["message"])

    server = Server("raises", on_call_tool=call_tool)
    app = server.streamable_http_app(
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with serving(app) as url, connect(f"{url}/mcp", None) as client:
        with pytest.raises(MCPError) as protocol_error:
            await client.call_tool("protocol_error", {})
        with pytest.raises(MCPError) as crash:
            await client.call_tool("crash", {})
    assert protocol_error.value.code == -32000  # an exception in the caller, never a CallToolResult
    assert crash.value.message == "Internal server error"
    assert "ops-bot" not in crash.value.message and crash.value.error.data is None


@pytest.mark.anyio
async def test_a_tool_error_in_the_high_level_server_becomes_bare_text() -> None:
    app = MCPServer("raises")

    @app.tool()
    def refund() -> str:
        raise ToolError("budget_exhausted: stop")

    async with Client(app) as client:
        result = await client.call_tool("refund", {})
    assert result.is_error is True
    assert result.structured_content is None, "the refusal's data did not survive the raise"
    assert "budget_exhausted" in result.content[0].text  # type: ignore[union-attr]
