"""The seed's "Check it worked" behaviours, against a real gateway, a real upstream and real MCP clients."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from haltwire.gateway.killswitch import write_suspensions
from haltwire.refusal import iso_utc
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def error_of(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    assert result.structured_content is not None, "a refusal carries structuredContent"
    error: dict[str, Any] = result.structured_content["error"]
    assert result.content[0].text == error["message"]  # type: ignore[union-attr]
    return error


async def run_agent(client: Any, tool: str = "lookup_order", cap: int = 200) -> dict[str, Any]:
    """A scripted agent: repeats one call and stops when an answer says it is final."""
    log: dict[str, Any] = {"calls": 0, "served": 0, "stopped_by": f"its own {cap}-step cap", "last": None}
    for _ in range(cap):
        result = await client.call_tool(tool, {"order_id": "A-1"})
        log["calls"] += 1
        log["last"] = result
        if not result.is_error:
            log["served"] += 1
            continue
        error = (result.structured_content or {}).get("error", {})
        if error.get("retryable") is False:
            log["stopped_by"] = "the server"
            break
    return log


async def test_the_call_after_the_budget_is_terminal_and_the_agent_stops() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 5})) as (_, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as ops:
            log = await run_agent(ops)
    assert log["stopped_by"] == "the server"
    assert log["calls"] == 6, "five served, then one refusal, then nothing"
    assert demo.served["lookup_order"] == 5
    error = error_of(log["last"])
    assert error["code"] == "budget_exhausted"
    assert error["retryable"] is False
    assert "resets_at" in error
    assert "try again" not in error["message"].lower() and "retry" not in error["message"].lower()


async def test_the_refusal_repeats_until_the_window_resets_and_then_lifts() -> None:
    clock = FakeClock(3600 * 500_000 + 10)  # ten seconds into a one-hour window
    async with running_upstream() as (demo, up):
        data = config_dict(up, limits={"budget": 2, "window_s": 3600})
        async with running_gateway(data, clock=clock) as (_, url), connect(url, TOKENS["ops-bot"]) as ops:
            for _ in range(2):
                assert not (await ops.call_tool("lookup_order", {})).is_error
            first = error_of(await ops.call_tool("lookup_order", {}))
            clock.now += 3000  # still inside the window
            again = error_of(await ops.call_tool("lookup_order", {}))
            assert first["code"] == again["code"] == "budget_exhausted"
            assert first["resets_at"] == again["resets_at"] == iso_utc(3600 * 500_001)
            clock.now += 590  # the window has reset
            assert not (await ops.call_tool("lookup_order", {})).is_error
    assert demo.served["lookup_order"] == 3


async def test_a_fresh_connection_with_the_same_token_gets_the_same_refusal() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 3})) as (_, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as ops:
            await run_agent(ops)
        for _ in range(3):  # reconnecting (a new client, a new HTTP connection) changes nothing
            async with connect(url, TOKENS["ops-bot"]) as again:
                assert error_of(await again.call_tool("lookup_order", {}))["code"] == "budget_exhausted"
    assert demo.served["lookup_order"] == 3


async def test_one_identitys_budget_leaves_another_untouched() -> None:
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 3})) as (_, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as ops, connect(url, TOKENS["billing-bot"]) as billing:
            log = await run_agent(ops)
            assert log["served"] == 3
            for _ in range(3):
                assert not (await billing.call_tool("lookup_order", {})).is_error
            assert error_of(await billing.call_tool("lookup_order", {}))["code"] == "budget_exhausted"
    assert demo.served["lookup_order"] == 6


async def test_a_failing_handler_releases_its_slot() -> None:
    async with running_upstream() as (demo, up):
        data = config_dict(up, limits={"max_in_flight": 1})
        async with running_gateway(data) as (app, url), connect(url, TOKENS["ops-bot"]) as ops:
            for _ in range(3):
                # The upstream's handler raises; the SDK answers with a JSON-RPC error, passed on as is.
                with pytest.raises(MCPError, match="Internal server error"):
                    await ops.call_tool("fail", {})
            # The slot came back each time: a cap of one still admits the next call.
            assert not (await ops.call_tool("lookup_order", {})).is_error
            assert app.gateway.ceilings.store.in_flight("ops-bot:f") == 0  # type: ignore[attr-defined]


async def test_a_burst_of_five_gets_exactly_two_slots_even_when_three_arrive_late() -> None:
    async with running_upstream() as (demo, up):
        data = config_dict(up, limits={"max_in_flight": 2})
        async with running_gateway(data) as (_, url), connect(url, TOKENS["ops-bot"]) as ops:
            results: list[CallToolResult] = []

            async def call(delay: float) -> None:
                await anyio.sleep(delay)
                results.append(await ops.call_tool("hold", {}))

            async with anyio.create_task_group() as tg:
                for delay in (0, 0, 0.3, 0.3, 0.3):
                    tg.start_soon(call, delay)
                # The two admitted calls are held inside the upstream until the three late
                # ones have been refused, so no late call can find a freed slot.
                with anyio.fail_after(10):
                    while len(results) < 3:
                        await anyio.sleep(0.01)
                demo.release()
    refused = [error_of(r) for r in results if r.is_error]
    assert len(results) == 5 and len(refused) == 3
    assert all(e["code"] == "too_many_in_flight" and e["retryable"] is True for e in refused)
    assert all(e["retry_after_s"] == 1 for e in refused)
    assert demo.served["hold"] == 2 and demo.max_in_flight == 2


async def test_operator_suspends_then_clears_on_the_same_connection(tmp_path: Path) -> None:
    switch = tmp_path / "suspended.json"
    async with running_upstream() as (demo, up):
        data = config_dict(up, gateway={"development": True, "suspended_file": str(switch)})
        async with running_gateway(data) as (_, url), connect(url, TOKENS["ops-bot"]) as ops:
            for _ in range(5):
                assert not (await ops.call_tool("lookup_order", {})).is_error
            write_suspensions(switch, ["ops-bot"])
            error = error_of(await ops.call_tool("lookup_order", {}))
            assert error["code"] == "agent_suspended" and error["retryable"] is False
            async with connect(url, TOKENS["billing-bot"]) as billing:  # nobody else is touched
                assert not (await billing.call_tool("lookup_order", {})).is_error
            write_suspensions(switch, [])
            assert not (await ops.call_tool("lookup_order", {})).is_error
    assert demo.served["lookup_order"] == 7


async def test_a_half_written_kill_switch_keeps_its_last_good_list(tmp_path: Path) -> None:
    switch = tmp_path / "suspended.json"
    write_suspensions(switch, ["ops-bot"])
    async with running_upstream() as (_, up):
        data = config_dict(up, gateway={"development": True, "suspended_file": str(switch)})
        async with running_gateway(data) as (_, url), connect(url, TOKENS["ops-bot"]) as ops:
            assert error_of(await ops.call_tool("lookup_order", {}))["code"] == "agent_suspended"
            switch.write_text('{"suspended": ["billing-b')  # an editor caught mid-write
            assert error_of(await ops.call_tool("lookup_order", {}))["code"] == "agent_suspended"
            async with connect(url, TOKENS["billing-bot"]) as billing:
                assert not (await billing.call_tool("lookup_order", {})).is_error
            switch.unlink()  # missing file: nobody suspended
            assert not (await ops.call_tool("lookup_order", {})).is_error


async def test_edge_refusals_are_http_statuses_and_the_client_raises_after_one_attempt() -> None:
    async with running_upstream() as (demo, up):
        identities = [
            {"agent": "edge-bot", "token": TOKENS["edge-bot"], "refuse_at": "edge", "limits": {"budget": 1}},
            {"agent": "gone-bot", "token": "tok-gone", "suspended_at_edge": True},
        ]
        async with running_gateway(config_dict(up, identities=identities)) as (_, url):
            posts: list[int] = []

            async def count(response: httpx2.Response) -> None:
                if response.request.method == "POST":
                    posts.append(response.status_code)

            for token, expected in (("tok-gone", 403), (TOKENS["edge-bot"], 429)):
                http = httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {token}"}, event_hooks={"response": [count]}
                )
                posts.clear()
                transport = streamable_http_client(url, http_client=http)
                with pytest.raises(Exception) as raised:
                    # Pinned to the modern protocol, so the only POSTs are the tool calls.
                    async with http, Client(transport, cache=None, mode="2026-07-28") as client:
                        if token == TOKENS["edge-bot"]:
                            assert not (await client.call_tool("lookup_order", {})).is_error
                            posts.clear()
                        await client.call_tool("lookup_order", {})
                assert str(expected) in repr(raised.value) or expected in posts
                assert posts.count(expected) == 1, f"one attempt, no retry: {posts}"
    assert demo.served["lookup_order"] == 1


async def test_the_counters_down_answer_at_the_edge_is_503() -> None:
    from haltwire.store.counters.redis import RedisCounters

    dead = RedisCounters("redis://127.0.0.1:1/0", timeout_s=0.2)
    async with running_upstream() as (demo, up):
        identities = [{"agent": "edge-bot", "token": TOKENS["edge-bot"], "refuse_at": "edge"}]
        data = config_dict(up, identities=identities, limits={"budget": 10})
        async with running_gateway(data, store=dead) as (_, url):
            async with httpx2.AsyncClient() as http:
                response = await http.post(url, headers=_headers(TOKENS["edge-bot"]), content=_call_body())
            # The official client, too, raises after one attempt on a 503: it does not retry.
            posts: list[int] = []

            async def count(r: httpx2.Response) -> None:
                if r.request.method == "POST":
                    posts.append(r.status_code)

            http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {TOKENS['edge-bot']}"}, event_hooks={"response": [count]}
            )
            transport = streamable_http_client(url, http_client=http)
            with pytest.raises(Exception) as raised:  # MCPError, maybe inside the client's task group
                async with http, Client(transport, cache=None, mode="2026-07-28") as client:
                    await client.call_tool("lookup_order", {})
            assert "MCPError" in repr(raised.value)
            assert posts == [503]
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert response.json()["error"]["code"] == "counters_unavailable"
    assert demo.served["lookup_order"] == 0


def _headers(token: str | None, name: str = "lookup_order") -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _call_body(name: str = "lookup_order", request_id: int = 1) -> bytes:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "_meta": meta},
    }
    return json.dumps(body).encode()


async def test_no_token_or_an_unknown_one_gets_401_with_the_error_shape() -> None:
    async with running_upstream() as (demo, up), running_gateway(config_dict(up)) as (_, url):
        async with httpx2.AsyncClient() as http:
            for token in (None, "not-a-token"):
                response = await http.post(url, headers=_headers(token), content=_call_body())
                assert response.status_code == 401
                error = response.json()["error"]
                assert error["code"] == "unauthenticated" and error["retryable"] is False
                assert response.headers["www-authenticate"].startswith("Bearer")
            # A malformed Authorization header is no token at all.
            bad = {**_headers(None), "Authorization": "Basic b3BzOmJvdA=="}
            assert (await http.post(url, headers=bad, content=_call_body())).status_code == 401
    assert demo.served["lookup_order"] == 0


async def test_an_oversized_body_gets_413() -> None:
    async with running_upstream() as (demo, up):
        data = config_dict(up, gateway={"development": True, "max_body_bytes": 4096})
        async with running_gateway(data) as (_, url), httpx2.AsyncClient() as http:
            big = json.loads(_call_body())
            big["params"]["arguments"] = {"order_id": "x" * 10_000}
            response = await http.post(url, headers=_headers(TOKENS["ops-bot"]), content=json.dumps(big))
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "payload_too_large"

            # Without a Content-Length (chunked), the limit holds while reading.
            async def chunks() -> Any:
                for _ in range(10):
                    yield b" " * 1000

            response = await http.post(url, headers=_headers(TOKENS["ops-bot"]), content=chunks())
            assert response.status_code == 413

            # Not a tools/call: the SDK's path, where the refusal was plain text.
            headers = {k: v for k, v in _headers(TOKENS["ops-bot"]).items() if not k.startswith("Mcp-")}
            response = await http.post(url, headers=headers, content=chunks())
            assert response.status_code == 413
            assert response.json()["error"]["code"] == "payload_too_large"
    assert demo.served["lookup_order"] == 0


async def test_malformed_json_rpc_gets_a_protocol_error() -> None:
    async with running_upstream() as (demo, up), running_gateway(config_dict(up)) as (_, url):
        async with httpx2.AsyncClient() as http:
            headers = _headers(TOKENS["ops-bot"])
            parse = await http.post(url, headers=headers, content=b'{"jsonrpc": "2.0", "id": 1, "method"')
            assert parse.status_code == 400 and parse.json()["error"]["code"] == -32700
            batch = await http.post(url, headers=headers, content=b"[1, 2]")
            assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600
            no_meta = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "x"}})
            envelope = await http.post(url, headers=headers, content=no_meta)
            assert envelope.status_code == 400 and envelope.json()["id"] == 7
            unknown = await http.post(
                url, headers=_headers(TOKENS["ops-bot"], "nope"), content=_call_body("nope")
            )
            assert unknown.json()["error"]["code"] == -32602 and "nope" in unknown.json()["error"]["message"]
    assert demo.served["lookup_order"] == 0
