"""Handshake-era ``tools/call`` on the fast path (``haltwire.gateway.legacy``).

The fast path must answer a 2024-11-05 to 2025-11-25 client exactly as the SDK's stateless
handler does, as a JSON body rather than the SDK's one server-sent event (the transport allows
either; see the module). The SDK still serves a call that carries a progress token, so the same
call with and without one is answered once by each path: the fast path's body must match the
SDK's event's data byte for byte (the upstream sends no progress), for a result, a refusal and a
protocol error, at every handshake version and with no version header. The SDK's handler logs each transport it creates at debug
level: the fast path must create none.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2
import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

SDK_TRANSPORT_LOG = "Stateless mode: Creating new transport"


async def post(
    http: httpx2.AsyncClient, url: str, version: str | None, params: dict[str, Any], **headers: str
) -> httpx2.Response:
    sent = {
        "authorization": f"Bearer {TOKENS['ops-bot']}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        **({"mcp-protocol-version": version} if version else {}),
        **headers,
    }
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    return await http.post(url, content=json.dumps(body), headers=sent)


def sdk_transports(caplog: pytest.LogCaptureFixture) -> int:
    return sum(SDK_TRANSPORT_LOG in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("version", [*HANDSHAKE_PROTOCOL_VERSIONS, None])
async def test_the_fast_path_answers_as_the_sdk_does(
    version: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp.server.streamable_http_manager")
    calls = [
        {"name": "lookup_order", "arguments": {"order_id": "A-1"}},  # a result
        {"name": "no_such_tool", "arguments": {}},  # a JSON-RPC error
        {"name": "lookup_order", "arguments": {"order_id": "A-2"}},  # past the budget: a refusal
    ]
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 2})) as (_, url),
        httpx2.AsyncClient(timeout=10) as http,
    ):
        answers = []
        for call in calls:
            before = sdk_transports(caplog)
            fast = await post(http, url, version, call)
            assert sdk_transports(caplog) == before, "the fast path handed the call to the SDK"
            with_progress = {**call, "_meta": {"progressToken": "p-1"}}
            sdk = await post(http, url, version, with_progress)
            assert sdk_transports(caplog) == before + 1, "a call with a progress token is the SDK's"
            assert (fast.status_code, fast.headers["content-type"]) == (sdk.status_code, "application/json")
            assert sdk.headers["content-type"] == "text/event-stream"
            assert fast.headers["content-length"] == str(len(fast.content))
            assert sdk.content == b"event: message\r\ndata: " + fast.content + b"\r\n\r\n", (fast.text, sdk.text)
            answers.append(fast.text)
    assert '"order A-1: shipped"' in answers[0] and '"resultType"' not in answers[0]
    assert '"error":{"code":-32602' in answers[1]
    assert "budget_exhausted" in answers[2] and '"isError":true' in answers[2]
    assert demo.served["lookup_order"] == 2  # the second A-1 (by the SDK) used the budget's last call


async def test_requests_the_sdk_would_refuse_are_left_to_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp.server.streamable_http_manager")
    call = {"name": "lookup_order", "arguments": {"order_id": "A-1"}}
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up)) as (_, url),
        httpx2.AsyncClient(timeout=10) as http,
    ):
        json_only = await post(http, url, "2025-11-25", call, accept="application/json")
        form = await post(http, url, "2025-11-25", call, **{"content-type": "text/plain"})
        bad_meta = await post(http, url, "2025-11-25", {**call, "_meta": "x"})
    assert json_only.status_code == 406
    assert bad_meta.status_code == 200 and '"error":{"code":-32602' in bad_meta.text, bad_meta.text
    assert form.status_code == 400 and "content-type" in form.text.lower()
    assert sdk_transports(caplog) == 3
    assert demo.served["lookup_order"] == 0


async def test_the_official_client_in_legacy_mode_takes_the_fast_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp.server.streamable_http_manager")
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 3})) as (_, url),
        connect(url, TOKENS["ops-bot"], mode="legacy") as client,
    ):
        assert client.protocol_version == "2025-11-25"
        await client.list_tools()  # as an agent does first; the client would list on its first call
        handshake = sdk_transports(caplog)  # initialize, its notification and tools/list are the SDK's
        results = [await client.call_tool("lookup_order", {"order_id": f"A-{i}"}) for i in range(4)]
        assert sdk_transports(caplog) == handshake
    assert [r.is_error for r in results] == [False, False, False, True]
    assert results[3].structured_content is not None
    assert results[3].structured_content["error"]["code"] == "budget_exhausted"
    assert demo.served["lookup_order"] == 3


async def test_the_official_client_in_legacy_mode_keeps_one_connection_for_its_calls() -> None:
    """The SDK's client closes its connection after an SSE answer's event; the fast path's JSON
    answers leave it open for the next call (through a proxy that counts connections)."""
    async with (
        running_upstream() as (_, up),
        running_gateway(config_dict(up)) as (_, url),
        TcpProxy.running(int(url.rsplit(":", 1)[1].split("/")[0])) as proxy,
        connect(f"{proxy.url}/mcp", TOKENS["ops-bot"], mode="legacy") as client,
    ):
        await client.list_tools()
        before = proxy.accepted
        for i in range(10):
            assert not (await client.call_tool("lookup_order", {"order_id": f"A-{i}"})).is_error
        # One new connection at most: tools/list is the SDK's, answered as SSE, so the client
        # closed the connection it came on.
        assert proxy.accepted - before <= 1, proxy.accepted - before
