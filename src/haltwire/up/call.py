"""``haltwire call URL TOOL [ARGUMENTS] --token T``: one tool call through a gateway, with the
official MCP client (``haltwire.demo.stack.connect``), its result printed.

Exit 0 with the result's text (and its ``structuredContent`` as JSON); 1 when the tool answered
an error, a refusal printed as ``refused: CODE (retryable|terminal): MESSAGE``, or the gateway
answered a JSON-RPC error (an unknown tool, a token it does not know); 2 for arguments
that are not a JSON object or a URL without ``http://``; 3 when the gateway cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio
import httpx2
from mcp.shared.exceptions import MCPError

from haltwire.demo.client import connect
from haltwire.errors import describe, unwrapped

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def run(args: argparse.Namespace) -> int:
    try:
        arguments = json.loads(args.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        print("haltwire call: the arguments must be a JSON object, such as '{\"order_id\": \"A-1\"}'", file=sys.stderr)
        return EXIT_USAGE
    if not args.url.startswith(("http://", "https://")):
        print(f"haltwire call: {args.url!r} is not a URL: give http://HOST:PORT/mcp", file=sys.stderr)
        return EXIT_USAGE
    try:
        with unwrapped():
            return anyio.run(_call, args.url, args.tool, arguments, args.token, args.timeout)
    except (httpx2.HTTPError, OSError, TimeoutError) as exc:
        print(f"haltwire call: cannot reach {args.url}: {describe(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE


async def _call(url: str, tool: str, arguments: dict[str, Any], token: str, wait_s: float) -> int:
    connected = False
    try:
        with anyio.fail_after(wait_s), unwrapped():
            async with connect(url, token) as client:
                connected = True
                result = await client.call_tool(tool, arguments)
    except MCPError as exc:  # a JSON-RPC error, not a tool's result: no such tool, or no session
        what = "answered the call with an error" if connected else "refused the session (is the token an agent's?)"
        print(f"haltwire call: {url} {what}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    structured = result.structured_content
    error = (structured or {}).get("error") if result.is_error else None
    if isinstance(error, dict):
        kind = "retryable" if error.get("retryable") else "terminal"
        print(f"refused: {error.get('code')} ({kind}): {error.get('message')}")
        return EXIT_ERROR
    for block in result.content:
        text = getattr(block, "text", None)
        if text is not None:
            print(text)
    if structured:
        print(json.dumps(structured, sort_keys=True))
    return EXIT_ERROR if result.is_error else 0
