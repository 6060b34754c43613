"""The server roles of ``benchmarks/gateway.py``, each run in its own process (``gateway.py serve
ROLE ...``): the demo upstream behind a request counter, the SDK pass-through, FastMCP's proxy; and
the haltwire gateway's config and the lease its calls carry."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import httpx2

import tripwires as rule_cost
from gateway_common import AGENT, TOKEN
from procs import HOST

LEASE_SECRET = "bench-lease-key-never-in-production-0123456789"


def _counting(app: Any, counts: Counter[str]) -> Any:
    """Wrap an ASGI app: count every HTTP request by method and Mcp-Method; serve GET /requests."""
    import json

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["path"] == "/requests":
                body = json.dumps(dict(counts)).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            method = ""
            for k, v in scope["headers"]:
                if k == b"mcp-method":
                    method = v.decode("latin-1")
            counts[scope["method"]] += 1
            counts[f"{scope['method']} {method}"] += 1
        await app(scope, receive, send)

    return wrapped


async def serve_upstream(port: int, answer_bytes: int = 0) -> None:
    from haltwire.demo.upstream import DemoUpstream
    from haltwire.serve import listen, serve_forever

    demo = DemoUpstream(answer_bytes=answer_bytes)
    await serve_forever(_counting(demo.http_app(), Counter()), listen(HOST, port))


async def serve_bare(upstream: str, port: int, with_schema: bool) -> None:
    """A pass-through on the SDK's low-level Server: no checks, one long-lived client upstream."""
    import mcp.types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server
    from mcp.server.transport_security import TransportSecuritySettings

    from haltwire.serve import listen, serve_forever

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=None))
    async with http, Client(streamable_http_client(upstream, http_client=http), cache=None) as client:
        tools = (await client.list_tools()).tools
        schemas = {t.name: dict(t.input_schema) for t in tools}

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await client.call_tool(params.name, params.arguments)

        server: Server[Any] = Server(
            "bare",
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
            get_tool_input_schema=schemas.get if with_schema else None,
        )
        app = server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        await serve_forever(app, listen(HOST, port))


async def serve_fastmcp(upstream: str, port: int) -> None:
    """FastMCP's create_proxy over an already-connected client, rate-limited per bearer token."""
    from fastmcp import Client as FastMCPClient
    from fastmcp.server import create_proxy
    from fastmcp.server.dependencies import get_http_request
    from fastmcp.server.middleware.rate_limiting import RateLimitingMiddleware

    from haltwire.serve import listen, serve_forever

    def caller(context: Any) -> str:
        return str(get_http_request().headers.get("authorization", "anonymous"))

    async with FastMCPClient(upstream) as backend:
        # A connected client: the proxy reuses its session for every request instead of
        # opening a fresh backend session per request (the fastest configuration).
        proxy = create_proxy(backend, name="fastmcp-proxy")
        proxy.add_middleware(
            RateLimitingMiddleware(max_requests_per_second=1e9, burst_capacity=10**9, get_client_id=caller)
        )
        app = proxy.http_app(stateless_http=True, json_response=True, host_origin_protection=False)
        await serve_forever(app, listen(HOST, port))


def gateway_config(upstream: str, tripwires: bool = False) -> str:
    extra = ""
    if tripwires:
        extra = f"""
[[leases.keys]]
kid = "bench"
secret = "{LEASE_SECRET}"
"""
        for rule in rule_cost.FIVE:
            extra += "\n[[tripwires]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in rule.items())
    return f"""
[gateway]
development = true

[counters]
backend = "memory"

[limits]
budget = 1000000000
window_s = 3600
max_in_flight = 100000

[[identities]]
agent = "{AGENT}"
token = "{TOKEN}"

[[upstreams]]
name = "demo"
url = "{upstream}"
{extra}"""


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def lease_token() -> str:
    """A lease for one run of the benchmark's identity, signed as the control plane signs them."""
    from haltwire.tokens import LeaseClaims, LeaseKeys

    keys = LeaseKeys({"bench": LEASE_SECRET.encode()}, signing="bench")
    now = time.time()
    return keys.sign(LeaseClaims(f"run-{uuid.uuid4().hex[:8]}", AGENT, "default", "0", 0, now, now + 86400))
