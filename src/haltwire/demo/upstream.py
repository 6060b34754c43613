"""A demo upstream MCP server, on the official SDK's low-level ``Server``.

It stands for the tools an agent reaches through the gateway, and records what it
served so demos and tests can compare it with what the gateway admitted:

- ``lookup_order``: read-only. Counts calls per API key (the ``Authorization`` header the
  gateway sends upstream) and, with a quota, refuses past it the way a provider does:
  a 429-style error whose words invite a retry.
- ``hold``: waits until ``release()`` (or ``POST /control/release``); for in-flight caps.
- ``fail``: raises, so the handler fails.
- ``sleep``: sleeps ``seconds``; records whether it was cancelled.
- ``progress``: reports ``steps`` progress notifications, then answers.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_OBJ: dict[str, Any] = {"type": "object"}
_READ_ONLY = types.ToolAnnotations(read_only_hint=True)

TOOLS = [
    types.Tool(
        name="lookup_order",
        description="Read one order by id.",
        input_schema={"type": "object", "properties": {"order_id": {"type": "string"}}},
        output_schema={
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "status": {"type": "string"}},
            "required": ["order_id", "status"],
        },
        annotations=_READ_ONLY,
    ),
    # The others change nothing either; without the hint the MCP defaults would make them
    # destructive, so the gateway would label them irreversible.
    types.Tool(
        name="hold",
        description="Wait until the demo releases held calls.",
        input_schema=_OBJ,
        annotations=_READ_ONLY,
    ),
    types.Tool(name="fail", description="Always fails.", input_schema=_OBJ, annotations=_READ_ONLY),
    types.Tool(
        name="sleep",
        description="Sleep for a number of seconds.",
        input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
        annotations=_READ_ONLY,
    ),
    types.Tool(
        name="progress",
        description="Report progress, then answer.",
        input_schema={"type": "object", "properties": {"steps": {"type": "integer"}}},
        annotations=_READ_ONLY,
    ),
]


class DemoUpstream:
    def __init__(self, quota: int | None = None, answer_bytes: int = 0) -> None:
        self.quota = quota
        #: ``lookup_order``'s text padded by this many bytes (benchmarks: a tool result of a
        #: realistic size, where the cost of reading an answer shows).
        self.answer_bytes = answer_bytes
        self.served: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._gate = anyio.Event()
        self.server: Server[Any] = Server("demo-upstream", on_list_tools=self._list, on_call_tool=self._call)

    def release(self) -> None:
        """Let every held call finish; later ``hold`` calls wait again."""
        self._gate.set()
        self._gate = anyio.Event()

    def reset(self) -> None:
        for c in (self.served, self.refused, self.by_key, self.cancelled):
            c.clear()
        self.max_in_flight = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "served": dict(self.served),
            "refused": dict(self.refused),
            "cancelled": dict(self.cancelled),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "total_served": sum(self.served.values()),
        }

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _call(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        name, args = params.name, params.arguments or {}
        key = "stdio"
        if ctx.request is not None:
            key = ctx.request.headers.get("authorization", "anonymous")
        if self.quota is not None and self.by_key[key] >= self.quota:
            self.refused[name] += 1
            return types.CallToolResult(
                content=[
                    types.TextContent(
                        type="text",
                        text="Upstream refused: 429 quota exceeded for this API key. Try again later.",
                    )
                ],
                is_error=True,
            )
        self.by_key[key] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._run(ctx, name, args)
        except anyio.get_cancelled_exc_class():
            self.cancelled[name] += 1
            raise
        finally:
            self.in_flight -= 1

    async def _run(self, ctx: ServerRequestContext[Any, Any], name: str, args: dict[str, Any]) -> Any:
        if name == "lookup_order":
            order = {"order_id": str(args.get("order_id", "A-1")), "status": "shipped"}
            self.served[name] += 1
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text=f"order {order['order_id']}: shipped" + " " * self.answer_bytes)
                ],
                structured_content=order,
            )
        if name == "hold":
            await self._gate.wait()
        elif name == "fail":
            raise RuntimeError("the demo tool failed")
        elif name == "sleep":
            await anyio.sleep(float(args.get("seconds", 1.0)))
        elif name == "progress":
            steps = int(args.get("steps", 3))
            for i in range(steps):
                await ctx.session.report_progress(i + 1, steps, f"step {i + 1}")
        else:
            raise ValueError(f"Unknown tool: {name}")
        self.served[name] += 1
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{name}: done")])

    def http_app(self) -> Starlette:
        """Streamable HTTP at ``/mcp``, plus ``GET /state`` and ``POST /control/release|reset``."""

        async def state(request: Request) -> Response:
            return JSONResponse(self.snapshot())

        async def release(request: Request) -> Response:
            self.release()
            return JSONResponse({"ok": True})

        async def reset(request: Request) -> Response:
            self.reset()
            return JSONResponse({"ok": True})

        return self.server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            custom_starlette_routes=[
                Route("/state", state),
                Route("/control/release", release, methods=["POST"]),
                Route("/control/reset", reset, methods=["POST"]),
            ],
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="haltwire demo upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--quota", type=int, default=None, help="calls allowed per API key")
    parser.add_argument("--stdio", action="store_true", help="serve over stdin/stdout instead of HTTP")
    args = parser.parse_args(argv)
    demo = DemoUpstream(quota=args.quota)
    if args.stdio:

        async def run_stdio() -> None:
            async with stdio_server() as (read, write):
                await demo.server.run(read, write, demo.server.create_initialization_options())

        anyio.run(run_stdio)
        return
    import uvicorn

    uvicorn.run(demo.http_app(), host=args.host, port=args.port, log_level="warning")
