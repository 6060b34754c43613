"""A stdio MCP upstream whose ``sleep`` tool writes what became of each call to a journal file.

Run as ``python tests/stdio_journal_upstream.py JOURNAL``. One line per call as it ends:
``served`` or ``cancelled`` (the SDK cancels the handler when the client sends
``notifications/cancelled`` for it), so a test in another process can see what the upstream saw.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOL = types.Tool(
    name="sleep",
    description="Sleep for a number of seconds.",
    input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
    annotations=types.ToolAnnotations(read_only_hint=True),
)


def main(journal: Path) -> None:
    def note(line: str) -> None:
        with journal.open("a") as f:
            f.write(line + "\n")

    async def on_list(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[TOOL])

    async def on_call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            await anyio.sleep(float((params.arguments or {}).get("seconds", 1.0)))
        except anyio.get_cancelled_exc_class():
            note("cancelled")
            raise
        note("served")
        return types.CallToolResult(content=[types.TextContent(type="text", text="slept")])

    server: Server[Any] = Server("journal", on_list_tools=on_list, on_call_tool=on_call)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
