"""The lean path for ``tools/call`` to modern HTTP upstreams (``haltwire.upstreams.http``).

Everything runs against real servers on loopback: the demo upstream (the SDK's low-level
``Server``) behind a recorder of the HTTP requests it receives, the gateway in front of it,
and the official MCP client. The lean path's own tests (``ModernHttpCaller`` against
upstreams that answer in less common ways) run against scripted ASGI apps.
"""

from __future__ import annotations

import json
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.types import LATEST_PROTOCOL_VERSION, PROTOCOL_VERSION_META_KEY
from mcp_types import HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND

from haltwire.demo.upstream import DemoUpstream
from haltwire.gateway.app import GatewayApp
from haltwire.serve import bind, serving
from haltwire.upstreams import Upstream
from haltwire.upstreams import http as upstream_http
from haltwire.upstreams.http import ModernHttpCaller, UpstreamUnavailable
from harness import TOKENS, config_dict, connect, running_gateway
from upstream_harness import (
    JSON_HEADERS,
    SSE_HEADERS,
    Recorder,
    body_of,
    caller_for,
    recorded_upstream,
    scripted,
)

pytestmark = pytest.mark.anyio


def upstream_of(app: GatewayApp) -> Upstream:
    return app.gateway.upstreams.upstreams[0]


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.is_error and result.structured_content is not None, result
    error: dict[str, Any] = result.structured_content["error"]
    return error


async def test_one_post_per_call_carrying_the_envelope_headers_and_the_callers_meta() -> None:
    async with recorded_upstream() as (demo, up, seen), running_gateway(config_dict(up)) as (app, url):
        assert upstream_of(app)._modern is not None
        async with connect(url, TOKENS["ops-bot"]) as client:
            before = len(seen.requests)
            result = await client.call_tool(
                "lookup_order", {"order_id": "B-7"}, meta=cast(Any, {"trace": "t-1"})
            )
            assert len(seen.requests) == before + 1  # one HTTP request, nothing else
            for _ in range(5):
                assert not (await client.call_tool("lookup_order", {"order_id": "B-8"})).is_error
            assert len(seen.requests) == before + 6
    assert result.structured_content == {"order_id": "B-7", "status": "shipped"}
    # The upstream's serverInfo stamp is stripped; the gateway stamps its own.
    assert result.meta is not None
    assert result.meta["io.modelcontextprotocol/serverInfo"]["name"] == "haltwire"
    assert demo.served["lookup_order"] == 6

    call = seen.calls()[0]
    assert call.method == "POST" and call.path == "/mcp"
    assert call.headers["mcp-protocol-version"] == "2026-07-28"
    assert call.headers["mcp-method"] == "tools/call"
    assert call.headers["mcp-name"] == "lookup_order"
    assert "application/json" in call.headers["accept"] and "text/event-stream" in call.headers["accept"]
    assert call.headers["authorization"] == "Bearer shared-key"  # the upstream's configured header
    body = call.json()
    assert body["jsonrpc"] == "2.0" and body["method"] == "tools/call"
    assert body["params"]["name"] == "lookup_order"
    assert body["params"]["arguments"] == {"order_id": "B-7"}
    meta = body["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {}
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "haltwire"
    assert meta["trace"] == "t-1"  # the caller's own _meta goes through
    assert "progressToken" not in meta
    # Request ids are unique per upstream.
    ids = [c.json()["id"] for c in seen.calls()]
    assert len(set(ids)) == len(ids)


async def test_progress_notifications_are_forwarded() -> None:
    async with recorded_upstream() as (_, up, seen), running_gateway(config_dict(up)) as (_, url):
        async with connect(url, TOKENS["ops-bot"]) as client:
            for steps in (3, 1):
                notes: list[tuple[float, float | None, str | None]] = []

                async def on_progress(
                    progress: float,
                    total: float | None,
                    message: str | None,
                    notes: list[tuple[float, float | None, str | None]] = notes,
                ) -> None:
                    notes.append((progress, total, message))

                before = len(seen.calls())
                done = await client.call_tool("progress", {"steps": steps}, progress_callback=on_progress)
                assert not done.is_error
                assert notes == [(i, steps, f"step {i}") for i in range(1, steps + 1)]
                assert len(seen.calls()) == before + 1
                # The gateway's own progress token went upstream, not the caller's.
                assert (
                    seen.calls()[-1].json()["params"]["_meta"]["progressToken"]
                    == seen.calls()[-1].json()["id"]
                )
            # A call without progress, after streamed answers, on the same upstream connections.
            assert not (await client.call_tool("lookup_order", {})).is_error


async def test_a_json_rpc_error_from_the_upstream_is_forwarded_as_is() -> None:
    async with (
        recorded_upstream() as (demo, up, _),
        running_gateway(config_dict(up, limits={"max_in_flight": 1})) as (app, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as client:
            for _ in range(3):
                with pytest.raises(MCPError) as raised:
                    await client.call_tool("fail", {})
                assert raised.value.code == INTERNAL_ERROR
                assert raised.value.message == "Internal server error"
            assert not (await client.call_tool("lookup_order", {})).is_error
        assert app.gateway.ceilings.store.in_flight("ops-bot:f") == 0  # type: ignore[attr-defined]
    assert demo.served["lookup_order"] == 1


async def test_a_client_that_gives_up_cancels_the_upstream_request() -> None:
    async with (
        recorded_upstream() as (demo, up, _),
        running_gateway(config_dict(up, limits={"max_in_flight": 1})) as (app, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as client:
            with anyio.move_on_after(0.5):  # the agent gives up: its HTTP request is closed
                await client.call_tool("sleep", {"seconds": 30})
            with anyio.fail_after(5):
                while demo.cancelled["sleep"] < 1:  # the upstream saw its request closed
                    await anyio.sleep(0.02)
                while app.gateway.ceilings.store.in_flight("ops-bot:f"):  # type: ignore[attr-defined]
                    await anyio.sleep(0.02)
            assert not (await client.call_tool("lookup_order", {})).is_error
    assert demo.in_flight == 0


async def test_the_deadline_cancels_the_upstream_request() -> None:
    limits = {"max_in_flight": 1, "tools": {"sleep": {"deadline_s": 0.3}}}
    async with (
        recorded_upstream() as (demo, up, _),
        running_gateway(config_dict(up, limits=limits)) as (_, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as client:
            with anyio.fail_after(10):
                error = error_of(await client.call_tool("sleep", {"seconds": 30}))
            assert error["code"] == "deadline_exceeded"
            with anyio.fail_after(5):
                while demo.cancelled["sleep"] < 1:
                    await anyio.sleep(0.02)
            assert not (await client.call_tool("lookup_order", {})).is_error  # the slot is back


async def test_an_upstream_that_goes_away_is_unavailable_until_it_comes_back() -> None:
    sock = bind()
    port = sock.getsockname()[1]
    sock.close()
    stop = anyio.Event()

    async def run_upstream(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with recorded_upstream(port=port) as (_, up, _):
            task_status.started(up)
            await stop.wait()

    async with anyio.create_task_group() as tg:
        up = await tg.start(run_upstream)
        async with running_gateway(config_dict(up, limits={"max_in_flight": 1})) as (_, url):
            async with connect(url, TOKENS["ops-bot"]) as client:
                assert not (await client.call_tool("lookup_order", {})).is_error  # a kept-alive connection
                stop.set()
                await anyio.sleep(0.2)
                for _ in range(2):  # refused, and the slot comes back each time
                    assert (
                        error_of(await client.call_tool("lookup_order", {}))["code"] == "upstream_unavailable"
                    )
                stop = anyio.Event()
                await tg.start(run_upstream)  # the upstream is back on its port
                assert not (await client.call_tool("lookup_order", {})).is_error
                stop.set()


async def test_a_redirecting_upstream_falls_back_to_the_sdk_client() -> None:
    async with recorded_upstream() as (demo, up, seen):
        data = config_dict(up)
        data["upstreams"][0]["url"] = f"{up}/mcp/"  # Starlette redirects it to /mcp
        async with running_gateway(data) as (app, url), connect(url, TOKENS["ops-bot"]) as client:
            assert upstream_of(app)._modern is not None
            for _ in range(3):
                assert not (await client.call_tool("lookup_order", {})).is_error
            assert upstream_of(app)._modern is None  # later calls skip the redirect
    assert demo.served["lookup_order"] == 3
    # The lean path (its requests' user agent is haltwire/...) tried once, was redirected, and
    # left the calls to the SDK client (httpx2's requests), which follows the redirect.
    lean = [r for r in seen.calls() if r.headers.get("user-agent", "").startswith("haltwire/")]
    assert [r.path for r in lean] == ["/mcp/"]
    assert [r.path for r in seen.calls() if r not in lean][-2:] == ["/mcp/", "/mcp"]


def header_upstream(meta_extra: dict[str, Any]) -> tuple[Server[Any], list[dict[str, Any]]]:
    """An upstream whose tool mirrors an argument into ``Mcp-Param-Region`` and adds its own ``_meta``."""
    tool = types.Tool(
        name="route",
        description="Answers with the region it was routed by.",
        input_schema={
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "n": {"type": "integer"}},
        },
    )
    received: list[dict[str, Any]] = []
    schemas = {tool.name: tool.input_schema}

    async def on_list(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        received.append(dict(params.arguments or {}))
        if (params.arguments or {}).get("region") == "nowhere":
            raise MCPError(INVALID_PARAMS, "no such region", {"region": "nowhere", "known": ["eu-west"]})
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"region {(params.arguments or {}).get('region')}")],
            _meta=meta_extra,
        )

    server: Server[Any] = Server(
        "header-upstream", on_list_tools=on_list, on_call_tool=on_call, get_tool_input_schema=schemas.get
    )
    return server, received


async def test_mcp_param_headers_are_sent_and_the_upstreams_own_meta_survives() -> None:
    server, received = header_upstream({"shard": 7})
    app = server.streamable_http_app(
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with recorded_upstream(app) as (_, up, seen), running_gateway(config_dict(up)) as (_, url):
        async with connect(url, TOKENS["ops-bot"]) as client:
            await client.list_tools()  # the client mirrors x-mcp-header arguments once it has listed them
            result = await client.call_tool("route", {"region": "eu-west", "n": 3})
            # The upstream's JSON-RPC error comes back whole: code, message and data.
            with pytest.raises(MCPError) as raised:
                await client.call_tool("route", {"region": "nowhere"})
    assert (raised.value.code, raised.value.message) == (INVALID_PARAMS, "no such region")
    assert raised.value.data == {"region": "nowhere", "known": ["eu-west"]}
    assert not result.is_error, result
    assert received == [{"region": "eu-west", "n": 3}, {"region": "nowhere"}]
    # The upstream validated Mcp-Param-Region against the body (a mismatch is HEADER_MISMATCH).
    assert [c.headers["mcp-param-region"] for c in seen.calls()] == ["eu-west", "nowhere"]
    assert result.meta is not None
    assert result.meta["shard"] == 7
    assert result.meta["io.modelcontextprotocol/serverInfo"]["name"] == "haltwire"


async def test_mcp_param_headers_that_disagree_with_the_body_are_refused_before_the_upstream() -> None:
    # The gateway checks the headers a tool's schema declares (worked out once per catalogue);
    # a tool that declares none ignores Mcp-Param-* headers, as the SDK's check does.
    server, received = header_upstream({})
    app = server.streamable_http_app(
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    envelope = {
        PROTOCOL_VERSION_META_KEY: LATEST_PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    async def post(
        http: httpx2.AsyncClient, url: str, tool: str, arguments: dict[str, Any], **headers: str
    ) -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": envelope},
        }
        sent = {
            "authorization": f"Bearer {TOKENS['ops-bot']}",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": LATEST_PROTOCOL_VERSION,
            "mcp-method": "tools/call",
            "mcp-name": tool,
            **headers,
        }
        answer = await http.post(url, json=body, headers=sent)
        text = answer.text
        return json.loads(text[text.index("{") :])

    async with recorded_upstream(app) as (_, up, _seen), running_gateway(config_dict(up)) as (_, url):
        async with httpx2.AsyncClient(timeout=10) as http:
            wrong = await post(http, url, "route", {"region": "eu-west"}, **{"mcp-param-region": "us-east"})
            missing = await post(http, url, "route", {"region": "eu-west"})
            right = await post(http, url, "route", {"region": "eu-west"}, **{"mcp-param-region": "eu-west"})
            stray = await post(http, url, "route", {"n": 1}, **{"mcp-param-other": "x"})
    assert wrong["error"]["code"] == HEADER_MISMATCH, wrong
    assert missing["error"]["code"] == HEADER_MISMATCH, missing
    assert "error" not in right and "error" not in stray, (right, stray)
    assert received == [{"region": "eu-west"}, {"n": 1}]


def cut_short(app: Any) -> Any:
    """``app``, except that a call of ``progress`` is answered with one progress event and no response."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] != "http" or headers.get(b"mcp-name") != b"progress":
            await app(scope, receive, send)
            return
        request = json.loads(await body_of(receive))
        progress = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": request["params"]["_meta"]["progressToken"], "progress": 1},
        }
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        # An event id and a retry time: there is nothing to resume all the same.
        await send({"type": "http.response.body", "body": sse(message(progress, "e-1", retry=10))})

    return wrapped


async def test_an_sse_answer_that_ends_without_a_response_is_upstream_unavailable() -> None:
    demo = DemoUpstream()
    async with (
        recorded_upstream(cut_short(demo.http_app())) as (_, up, seen),
        running_gateway(config_dict(up, limits={"max_in_flight": 1})) as (app, url),
    ):
        async with connect(url, TOKENS["ops-bot"]) as client:
            notes: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                notes.append(progress)

            with anyio.fail_after(10):
                result = await client.call_tool("progress", {"steps": 2}, progress_callback=on_progress)
            assert error_of(result)["code"] == "upstream_unavailable"
            assert notes == [1]  # what came before the end was relayed
            assert not (await client.call_tool("lookup_order", {})).is_error  # the slot is back
            assert upstream_of(app)._modern is not None  # and the lean path stays
    # One POST for the call: no GET to resume the stream.
    assert [r.method for r in seen.requests if r.headers.get("mcp-name") == "progress"] == ["POST"]


# --- ModernHttpCaller against upstreams that answer in less common ways ------------------


def sse(*events: str) -> bytes:
    return "".join(events).encode()


def message(data: dict[str, Any], event_id: str | None = None, retry: int | None = None) -> str:
    lines = [f"id: {event_id}\n"] if event_id else []
    if retry is not None:
        lines.append(f"retry: {retry}\n")
    lines.append("event: message\n")
    lines.append(f"data: {json.dumps(data)}\n\n")
    return "".join(lines)


def progress_note(token: Any, value: float) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": value, "total": 2},
    }


async def test_an_sse_answer_relays_this_calls_progress_and_ends_with_its_response() -> None:
    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        request = json.loads(body)
        token = request["params"]["_meta"]["progressToken"]
        log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
        result = {
            "jsonrpc": "2.0",
            "id": request["id"],
            "result": {"content": [], "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x"}}},
        }
        # A comment, a log message (not relayed), progress for another call (not relayed),
        # progress for this one, then the response.
        events = [": keep-alive\n\n", message(log), message(progress_note("other", 9), "e-1")]
        events += [message(progress_note(token, 1), "e-2"), message(result, "e-3")]
        return 200, SSE_HEADERS, sse(*events)

    notes: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, msg: str | None) -> None:
        notes.append((progress, total, msg))

    async with caller_for(scripted(answer)) as (caller, seen):
        result = await caller.call_tool("t", {}, None, cast(Any, on_progress))
    assert result == {"content": []}  # the upstream's serverInfo is stripped
    assert notes == [(1, 2, None)]
    assert [r.method for r in seen.requests] == ["POST"]


async def test_an_sse_answer_cut_short_is_unavailable_and_not_resumed() -> None:
    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        token = json.loads(body)["params"]["_meta"]["progressToken"]
        return 200, SSE_HEADERS, sse(message(progress_note(token, 1), "e-1", retry=10))

    notes: list[float] = []

    async def on_progress(progress: float, total: float | None, msg: str | None) -> None:
        notes.append(progress)

    async with caller_for(scripted(answer)) as (caller, seen):
        with pytest.raises(UpstreamUnavailable, match="ended without a response"):
            await caller.call_tool("t", {}, None, cast(Any, on_progress))
    assert notes == [1]
    assert [r.method for r in seen.requests] == ["POST"]


async def test_answers_in_every_framing_and_errors_at_any_status() -> None:
    answers: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []

    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        request_id = json.loads(body)["id"]
        status, response_headers, content = answers.pop(0)
        return status, response_headers, content.replace(b'"ID"', json.dumps(request_id).encode())

    text = [(b"content-type", b"text/plain")]
    ok = b'{"jsonrpc":"2.0","id":"ID","result":{"content":[{"type":"text","text":"ok"}]}}'
    error = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad arguments","data":{"x":1}}}'
    async with caller_for(scripted(answer)) as (caller, _):
        answers.append((200, JSON_HEADERS, ok))
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"
        # Events split across CRLF line ends and multi-line data.
        answers.append(
            (200, SSE_HEADERS, b"event: message\r\ndata: " + ok[:17] + b"\r\ndata: " + ok[17:] + b"\r\n\r\n")
        )
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"
        answers.append((400, JSON_HEADERS, error))
        with pytest.raises(MCPError) as raised:
            await caller.call_tool("t", None, None, None)
        assert (raised.value.code, raised.value.message, raised.value.data) == (
            -32602,
            "bad arguments",
            {"x": 1},
        )
        answers.append((200, JSON_HEADERS, error))  # an error with a 200 is an error too
        with pytest.raises(MCPError, match="bad arguments"):
            await caller.call_tool("t", None, None, None)
        answers.append((500, text, b"boom"))
        with pytest.raises(MCPError, match="error response"):
            await caller.call_tool("t", None, None, None)
        for status in (502, 503, 504):
            answers.append((status, text, b"no upstream"))
            with pytest.raises(UpstreamUnavailable, match=f"HTTP {status}"):
                await caller.call_tool("t", None, None, None)
        answers.append((404, text, b"not here"))
        with pytest.raises(MCPError) as raised:
            await caller.call_tool("t", None, None, None)
        assert (raised.value.code, raised.value.message) == (METHOD_NOT_FOUND, "Not Found")
        answers.append((202, [], b""))
        with pytest.raises(MCPError, match="202 Accepted"):
            await caller.call_tool("t", None, None, None)
        answers.append((200, [(b"content-type", b"text/html; charset=utf-8")], b"<p>ok</p>"))
        with pytest.raises(MCPError, match="Unexpected content type: text/html"):
            await caller.call_tool("t", None, None, None)
        answers.append((200, JSON_HEADERS, b"not json"))
        with pytest.raises(MCPError, match="parse"):
            await caller.call_tool("t", None, None, None)
        answers.append((200, JSON_HEADERS, ok.replace(b'"ID"', b'"another"')))
        with pytest.raises(MCPError, match="different request"):
            await caller.call_tool("t", None, None, None)
        answers.append((200, JSON_HEADERS, ok))  # the caller survived all of it
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"
    assert not answers


async def test_cancelling_a_call_mid_stream_closes_its_connection() -> None:
    """The upstream sees the call's HTTP request closed, even after its answer has begun."""
    disconnected = anyio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        token = json.loads(await body_of(receive))["params"]["_meta"]["progressToken"]
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        progress = sse(message(progress_note(token, 1)))
        await send({"type": "http.response.body", "body": progress, "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            disconnected.set()

    started = anyio.Event()

    async def on_progress(progress: float, total: float | None, msg: str | None) -> None:
        started.set()

    async with caller_for(app) as (caller, _), anyio.create_task_group() as tg:
        tg.start_soon(caller.call_tool, "t", {}, None, cast(Any, on_progress))
        with anyio.fail_after(5):
            await started.wait()
        tg.cancel_scope.cancel()
    with anyio.fail_after(5):
        await disconnected.wait()


async def test_an_unreachable_upstream_is_unavailable() -> None:
    sock = bind()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    caller = ModernHttpCaller(f"http://127.0.0.1:{port}/mcp", "2026-07-28", [], name="gone")
    try:
        with pytest.raises(UpstreamUnavailable, match="gone: "):
            await caller.call_tool("t", None, None, None)
    finally:
        await caller.aclose()
    with pytest.raises(UpstreamUnavailable, match="not connected"):
        await caller.call_tool("t", None, None, None)  # a closed caller sends nothing


async def test_the_proxy_settings_of_the_environment_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        request_id = json.loads(body)["id"]
        return 200, JSON_HEADERS, json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {}}).encode()

    recorder = Recorder()
    async with serving(recorder.wrap(scripted(answer))) as proxy:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy)
        caller = ModernHttpCaller("http://upstream.invalid/mcp", "2026-07-28", [], name="via-proxy")
        try:
            assert await caller.call_tool("t", None, None, None) == {}
        finally:
            await caller.aclose()
    assert [r.headers["host"] for r in recorder.requests] == ["upstream.invalid"]


def test_the_sse_decoder_follows_the_line_rules() -> None:
    decoder = upstream_http._SSEDecoder(1000)
    out: list[str] = []
    for piece in [
        b"data: a\r",
        b"\ndata:b\r\n",
        b"\r",
        b"\nevent: other\ndata: x\n\n",
        b": c\nid: 7\nretry: 5\ndata: \xc3",
        b"\xa9\n",
        b"\r",
    ]:
        out += decoder.feed(piece)
    out += decoder.feed(b"", final=True)
    assert out == ["a\nb", "\u00e9"]  # the "other" event is not a message
    with pytest.raises(upstream_http._ProtocolViolation):
        upstream_http._SSEDecoder(10).feed(b"data: " + b"x" * 20 + b"\n")
