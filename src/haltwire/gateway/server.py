"""The gateway as an MCP server, on the official SDK's low-level ``Server``.

This serves everything the fast path in ``haltwire.gateway.app`` hands over: discovery,
``tools/list``, handshake-era (2025-11-25) clients, and any request that is not a
well-formed modern ``tools/call``. Calls go through the same ``Gateway`` pipeline.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from haltwire.gateway.credentials import CREDENTIAL_STATE_KEY
from haltwire.gateway.proxy import Gateway
from haltwire.identity import Identity
from haltwire.meta import LEASE_HEADER
from haltwire.refusal import Refusal

IDENTITY_STATE_KEY = "haltwire.identity"


def identity_of(ctx: ServerRequestContext[Any, Any]) -> Identity:
    """The identity the HTTP edge resolved for this request (the edge refuses requests without one)."""
    request = ctx.request
    identity = request.scope.get("state", {}).get(IDENTITY_STATE_KEY) if request is not None else None
    if not isinstance(identity, Identity):
        raise RuntimeError("request reached the MCP server without an identity; the edge must resolve it")
    return identity


def build_server(gateway: Gateway, version: str) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=gateway.tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta = dict(params.meta) if params.meta else None
        report = None
        if meta and "progressToken" in meta:

            async def report(progress: float, total: float | None, message: str | None) -> None:
                await ctx.session.report_progress(progress, total, message)

        lease_header = None
        if gateway.leases is not None and ctx.request is not None:
            lease_header = ctx.request.headers.get(LEASE_HEADER)
        credential = ctx.request.scope.get("state", {}).get(CREDENTIAL_STATE_KEY) if ctx.request else None
        session = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
        result = await gateway.call_tool(
            identity_of(ctx),
            params.name,
            params.arguments,
            meta,
            report,
            lease_header,
            credential,
            (ctx.request_id, session),
        )
        wire = result.tool_result() if isinstance(result, Refusal) else result
        return types.CallToolResult.model_validate(wire)

    return Server(
        "haltwire",
        version=version,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # Without this the SDK runs tools/list before every call with arguments, to validate
        # Mcp-Param-* headers: a hidden second request per call.
        get_tool_input_schema=gateway.upstreams.input_schema,
    )
