"""Handshake-era ``tools/call`` (protocol 2024-11-05 to 2025-11-25) on the fast path.

Clients that open with ``initialize`` (the TypeScript SDK 1.x, the MCP Inspector, the official
Python client in legacy mode) send each later call with ``MCP-Protocol-Version`` set to the
version they negotiated, or with none (2025-03-26). The SDK's stateless handler serves each such
call with a session of its own (a transport, a dispatcher, their tasks and streams), which costs
more than every check haltwire makes. The fast path serves them through the same pipeline as a
modern call and answers with what that handler's one server-sent event holds: HTTP 200 and the
JSON-RPC answer, errors included; the result shaped by the SDK's surface for the client's
version (``serialize_server_result``: a 2026 field such as ``resultType`` is not sent to a 2025
client); a refusal as a tool result, as the SDK path gives it.

The answer is a JSON body, not an SSE stream: the transport lets a server answer a request
either way and every client must take both, and the SDK's client closes its connection after
an SSE answer's event (it does not read the stream's end), so an SSE answer cost each call a new
TCP connection (``benchmarks/gateway.py``, ``haltwire-hs``).

The gateway is stateless (it issues no ``Mcp-Session-Id``), so a session id a client sends is
ignored here as the SDK's stateless handler ignores it. What the fast path does not take goes to
the SDK as before: a progress token (its notifications are the SDK session's to send), an
``Accept`` without both JSON and SSE or a ``Content-Type`` other than JSON (the SDK answers
those 406 and 415), a ``_meta`` that is not an object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from mcp_types.methods import serialize_server_result
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from haltwire.gateway.progress import Outcome
from haltwire.gateway.wire import jsonrpc_error, jsonrpc_result
from haltwire.refusal import Refusal

#: The version a request without ``MCP-Protocol-Version`` speaks (the transport spec's default).
DEFAULT_VERSION: Final = "2025-03-26"
#: The fast path's answers are JSON (the module's docstring says why).
HEADERS: Final = [(b"content-type", b"application/json")]


def _media_types(header: str) -> list[str]:
    return [part.strip().split(";")[0].strip().lower() for part in header.split(",")]


def served_version(headers: Mapping[str, str], params: Mapping[str, Any]) -> str | None:
    """The protocol version of a handshake-era ``tools/call`` the fast path serves, else None.

    ``headers``: the request's ``MCP-Protocol-Version``, ``Accept`` and ``Content-Type`` (lower-case
    names); ``params``: the call's params.
    """
    version = headers.get("mcp-protocol-version", DEFAULT_VERSION)
    if version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    # The SDK's checks, in its order: Accept (JSON and SSE, wildcards allowed), then Content-Type.
    accepted = _media_types(headers.get("accept", ""))
    anything = "*/*" in accepted
    if not (anything or "application/json" in accepted or "application/*" in accepted):
        return None
    if not (anything or "text/event-stream" in accepted or "text/*" in accepted):
        return None
    content_type = headers.get("content-type", "").split(";")[0]
    if "application/json" not in (part.strip() for part in content_type.split(",")):
        return None
    meta = params.get("_meta")
    if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
        return None
    return version


def answer(request_id: str | int, outcome: Outcome, version: str) -> bytes:
    """``outcome`` as the JSON-RPC answer the SDK's handler would send ``version``'s client (the
    data of its one server-sent event)."""
    if isinstance(outcome, MCPError):
        payload = jsonrpc_error(request_id, outcome.code, outcome.message, outcome.data)
    else:
        wire: dict[str, Any] = outcome.tool_result() if isinstance(outcome, Refusal) else outcome
        try:
            payload = jsonrpc_result(request_id, serialize_server_result("tools/call", version, wire))
        except ValidationError:
            # The SDK's answer to a result its surface rejects; the detail stays out of the answer.
            payload = jsonrpc_error(request_id, INTERNAL_ERROR, "Handler returned an invalid result")
    return payload
