"""The lean path for ``tools/call`` to modern HTTP upstreams (``haltwire.gateway.upstreams``).

Everything runs against real servers on loopback: the demo upstream (the SDK's low-level
``Server``) behind a recorder of the HTTP requests it receives, the gateway in front of it,
and the official MCP client. Each gateway test runs twice: over the plain HTTP/1.1 path the
gateway picks for an ``http://`` upstream, and over the httpx2 path it keeps for TLS and
proxies.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from haltwire.demo.upstream import DemoUpstream
from haltwire.gateway import upstreams as upstreams_module
from haltwire.gateway.app import GatewayApp
from haltwire.gateway.upstreams import ModernHttpCaller, Upstream
from haltwire.serve import bind, serving
from harness import TOKENS, config_dict, connect, running_gateway

pytestmark = pytest.mark.anyio


@dataclass
class Seen:
    """One HTTP request as the upstream received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Recorder:
    requests: list[Seen] = field(default_factory=list)

    def calls(self) -> list[Seen]:
        return [r for r in self.requests if r.headers.get("mcp-method") == "tools/call"]

    def wrap(self, app: Any) -> Any:
        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            self.requests.append(Seen(scope["method"], scope["path"], headers, b"".join(chunks)))
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                return await receive()

            await app(scope, replay, send)

        return recorded


@asynccontextmanager
async def recorded_upstream(
    app: Any | None = None, *, port: int = 0
) -> AsyncIterator[tuple[DemoUpstream, str, Recorder]]:
    """The demo upstream (or ``app``) behind a recorder; yields it, its base URL and the recorder."""
    demo = DemoUpstream()
    recorder = Recorder()
    async with serving(recorder.wrap(app if app is not None else demo.http_app()), port=port) as url:
        yield demo, url, recorder


@pytest.fixture(params=["plain", "httpx2"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which HTTP path the gateway's lean calls take."""
    if request.param == "httpx2":
        monkeypatch.setattr(upstreams_module._Http11, "suits", staticmethod(lambda url, headers: False))
    return str(request.param)


def upstream_of(app: GatewayApp) -> Upstream:
    return app.gateway.upstreams.upstreams[0]


def error_of(result: types.CallToolResult) -> dict[str, Any]:
    assert result.is_error and result.structured_content is not None, result
    error: dict[str, Any] = result.structured_content["error"]
    return error


async def test_one_post_per_call_carrying_the_envelope_headers_and_the_callers_meta(path: str) -> None:
    async with recorded_upstream() as (demo, up, seen), running_gateway(config_dict(up)) as (app, url):
        modern = upstream_of(app)._modern
        assert modern is not None and modern.plain == (path == "plain")
        async with connect(url, TOKENS["ops-bot"]) as client:
            before = len(seen.requests)
            result = await client.call_tool("lookup_order", {"order_id": "B-7"}, meta={"trace": "t-1"})
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


async def test_progress_notifications_are_forwarded(path: str) -> None:
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


async def test_a_json_rpc_error_from_the_upstream_is_forwarded_as_is(path: str) -> None:
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


async def test_a_client_that_gives_up_cancels_the_upstream_request(path: str) -> None:
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


async def test_the_deadline_cancels_the_upstream_request(path: str) -> None:
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


async def test_an_upstream_that_goes_away_is_unavailable_until_it_comes_back(path: str) -> None:
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
    # The lean path (the one asking for an unencoded answer) tried once, was redirected, and
    # left the calls to the SDK client, which follows the redirect.
    lean = [r for r in seen.calls() if r.headers.get("accept-encoding") == "identity"]
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


async def test_mcp_param_headers_are_sent_and_the_upstreams_own_meta_survives(path: str) -> None:
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


def scripted(
    answer: Callable[[str, dict[str, str], bytes], tuple[int, list[tuple[bytes, bytes]], bytes]],
) -> Any:
    """An ASGI app answering each request with ``answer(method, headers, body)``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        status, response_headers, content = answer(scope["method"], headers, body)
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": content})

    return app


@asynccontextmanager
async def caller_for(app: Any, plain: bool) -> AsyncIterator[tuple[ModernHttpCaller, Recorder]]:
    recorder = Recorder()
    async with serving(recorder.wrap(app)) as base, httpx2.AsyncClient() as http:
        caller = ModernHttpCaller(http, f"{base}/mcp", "2026-07-28", [], plain=plain)
        try:
            yield caller, recorder
        finally:
            await caller.aclose()


SSE_HEADERS = [(b"content-type", b"text/event-stream")]


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "httpx2"])
async def test_an_sse_answer_cut_short_is_resumed_with_last_event_id(plain: bool) -> None:
    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        if method == "POST":
            request = json.loads(body)
            answer.request_id = request["id"]  # type: ignore[attr-defined]
            token = request["params"]["_meta"]["progressToken"]
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 1, "total": 2},
            }
            log = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": "x"},
            }
            # A comment, a log message (not relayed), progress, then the stream ends.
            return 200, SSE_HEADERS, sse(": keep-alive\n\n", message(log), message(progress, "e-1", retry=10))
        assert headers["last-event-id"] == "e-1"
        result = {
            "jsonrpc": "2.0",
            "id": answer.request_id,
            "result": {"content": [], "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "x"}}},
        }  # type: ignore[attr-defined]
        return 200, SSE_HEADERS, sse(message(result, "e-2"))

    notes: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, msg: str | None) -> None:
        notes.append((progress, total, msg))

    async with caller_for(scripted(answer), plain) as (caller, seen):
        result = await caller.call_tool("t", {}, None, on_progress)
    assert result == {"content": []}  # the upstream's serverInfo is stripped
    assert notes == [(1, 2, None)]
    assert [r.method for r in seen.requests] == ["POST", "GET"]


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "httpx2"])
async def test_answers_in_every_framing_and_errors_at_any_status(plain: bool) -> None:
    answers: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []

    def answer(
        method: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        request_id = json.loads(body)["id"]
        status, response_headers, content = answers.pop(0)
        return status, response_headers, content.replace(b'"ID"', json.dumps(request_id).encode())

    json_headers = [(b"content-type", b"application/json")]
    ok = b'{"jsonrpc":"2.0","id":"ID","result":{"content":[{"type":"text","text":"ok"}]}}'
    error = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad arguments","data":{"x":1}}}'
    async with caller_for(scripted(answer), plain) as (caller, _):
        answers.append((200, json_headers, ok))
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"
        # Events split across CRLF line ends and multi-line data.
        answers.append(
            (200, SSE_HEADERS, b"event: message\r\ndata: " + ok[:17] + b"\r\ndata: " + ok[17:] + b"\r\n\r\n")
        )
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"
        answers.append((400, json_headers, error))
        with pytest.raises(MCPError) as raised:
            await caller.call_tool("t", None, None, None)
        assert (raised.value.code, raised.value.message, raised.value.data) == (
            -32602,
            "bad arguments",
            {"x": 1},
        )
        answers.append((500, [(b"content-type", b"text/plain")], b"boom"))
        with pytest.raises(MCPError, match="error response"):
            await caller.call_tool("t", None, None, None)
        answers.append((503, [(b"content-type", b"text/plain")], b"no upstream"))
        with pytest.raises(upstreams_module.UpstreamUnavailable):
            await caller.call_tool("t", None, None, None)
        answers.append((200, json_headers, b"not json"))
        with pytest.raises(MCPError, match="parse"):
            await caller.call_tool("t", None, None, None)
        answers.append((200, json_headers, ok))  # the connection survived all of it
        assert (await caller.call_tool("t", None, None, None))["content"][0]["text"] == "ok"


def test_the_sse_decoder_follows_the_line_rules() -> None:
    decoder = upstreams_module._SSEDecoder(1000)
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
    assert decoder.last_event_id == "7" and decoder.retry_ms == 5
    with pytest.raises(upstreams_module._ProtocolViolation):
        upstreams_module._SSEDecoder(10).feed(b"data: " + b"x" * 20 + b"\n")
