"""The canary upstream: an MCP server whose tools, ``canary_write`` and ``canary_commit`` (the
same, irreversible: the executor rung's), are side effects that it records with its time, so a
drill can count what happened after a stop on the upstream's own word.

In this order, for each call of ``canary_write(run, what)`` (or ``canary_commit``):

1. the time is taken (``time.time()``: the drill compares it with times taken in another process
   on the same machine);
2. ``(time, run, what)`` is appended to the record;
3. the call answers ``written``.

``GET /record`` serves the whole record as JSON (``{"effects": [[time, run, what], ...]}``);
``GET /record?run=ID`` only that run's. Run it with ``python -m haltwire.drill.canary --port N``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOOL = "canary_write"
#: The executor rung's tool: irreversible (destructive, not idempotent), so the gateway makes each
#: call an intent and only the executor performs it; recorded as ``canary_write`` is.
TOOL_COMMIT = "canary_commit"

_TOOLS = [
    types.Tool(
        name=TOOL,
        description="Record one side effect of a canary run.",
        input_schema={
            "type": "object",
            "properties": {"run": {"type": "string"}, "what": {"type": "string"}},
            "required": ["run", "what"],
        },
        # A side effect, but neither destructive nor irreversible: the gateway serves it directly.
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    ),
    types.Tool(
        name=TOOL_COMMIT,
        description="Record one irreversible side effect of a canary run (performed by the executor).",
        input_schema={
            "type": "object",
            "properties": {"run": {"type": "string"}, "what": {"type": "string"}},
            "required": ["run", "what"],
        },
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False),
    ),
]


class Canary:
    """The record of side effects, and the MCP server that writes it."""

    def __init__(self) -> None:
        self.effects: list[tuple[float, str, str]] = []
        self.server: Server[Any] = Server(
            "haltwire-canary", on_list_tools=self._list, on_call_tool=self._call
        )

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_TOOLS)

    async def _call(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        if params.name not in (TOOL, TOOL_COMMIT):
            raise ValueError(f"Unknown tool: {params.name}")
        args = params.arguments or {}
        now = time.time()
        self.effects.append((now, str(args.get("run", "")), str(args.get("what", ""))))
        return types.CallToolResult(content=[types.TextContent(type="text", text="written")])

    def http_app(self) -> Starlette:
        """Streamable HTTP at ``/mcp``, the record at ``GET /record``."""

        async def record(request: Request) -> Response:
            run = request.query_params.get("run")
            effects = [e for e in self.effects if run is None or e[1] == run]
            return JSONResponse({"effects": [list(e) for e in effects]})

        return self.server.streamable_http_app(
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            custom_starlette_routes=[Route("/record", record)],
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m haltwire.drill.canary", description="the canary upstream"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(Canary().http_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
