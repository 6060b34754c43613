"""The TypeScript SDK 1.x client and the MCP Inspector CLI (handshake-era protocol) through the
gateway, on the fast path.

Most MCP clients in the field (the TypeScript SDK 1.x, the MCP Inspector) open with
``initialize`` and send every call with the version they negotiated: the gateway serves those
calls on its fast path (``haltwire.gateway.legacy``), with the same checks. The SDK's stateless
handler logs each transport it creates at debug level: after the handshake, none may be created.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

from harness import TOKENS, config_dict, running_gateway, running_upstream
from npm_harness import install_dir, installed_version, locked, node_and_npm, npm_install

pytestmark = pytest.mark.anyio

PACKAGE: Final = "@modelcontextprotocol/sdk"
VERSION: Final = "1.32.2"
INSPECTOR: Final = "@modelcontextprotocol/inspector"
INSPECTOR_VERSION: Final = "2.12.0"
SCRIPT: Final = Path(__file__).with_name("ts_client.mjs")
SDK_TRANSPORT_LOG = "Stateless mode: Creating new transport"


def ts_client() -> tuple[str, Path]:
    """``node`` and a folder holding the SDK and the script, installed if need be."""
    node, _ = node_and_npm()
    directory = install_dir("ts-sdk")
    with locked(directory):
        if installed_version(directory, PACKAGE) != VERSION:
            npm_install(directory, [f"{PACKAGE}@{VERSION}"])
    # Node resolves the package from the script's folder: the script runs from the install folder.
    (directory / SCRIPT.name).write_text(SCRIPT.read_text())
    return node, directory / SCRIPT.name


async def run_client(url: str, token: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node, script = ts_client()
    done = await anyio.run_process(
        [node, str(script), url, token, json.dumps(calls)], check=False, stderr=subprocess.PIPE
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


async def test_the_typescript_sdk_is_served_and_refused_on_the_fast_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp.server.streamable_http_manager")
    # The refusal is made on a tool without an output schema: the TypeScript SDK 1.x validates a
    # refusal's structuredContent against the tool's output schema even when isError is set, and
    # throws a schema error in its place (docs/architecture.md, "Known interoperability limits").
    calls = [
        {"name": "lookup_order", "arguments": {"order_id": "A-0"}},
        {"name": "sleep", "arguments": {"seconds": 0}},
        {"name": "sleep", "arguments": {"seconds": 0}},
        {"name": "no_such_tool", "arguments": {}},
    ]

    def transports() -> int:
        return sum(SDK_TRANSPORT_LOG in r.getMessage() for r in caplog.records)

    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 2})) as (_, url),
    ):
        # A client that only connects and lists: what the handshake costs on the SDK's path
        # (initialize, its notification, the SSE stream's GET, tools/list)...
        await run_client(url, TOKENS["ops-bot"], [])
        handshake = transports()
        lines = await run_client(url, TOKENS["ops-bot"], calls)
    # ...and a client that also makes four calls costs the same: the calls took the fast path.
    assert handshake >= 2 and transports() == 2 * handshake
    assert "lookup_order" in lines[0]["tools"]
    first, second, third, unknown = (line.get("result") or line.get("error") or {} for line in lines[1:])
    assert first["structuredContent"] == {"order_id": "A-0", "status": "shipped"}
    assert first["content"][0]["text"] == "order A-0: shipped" and not first.get("isError")
    assert not second.get("isError"), second
    # The refusal reaches the TypeScript client whole: terminal, its code, in one sentence.
    assert third.get("isError") is True, lines
    error = third["structuredContent"]["error"]
    assert (error["code"], error["retryable"]) == ("budget_exhausted", False)
    assert "resultType" not in third  # a 2026 field, not sent to a 2025 client
    assert unknown["code"] == -32602 and "no_such_tool" in unknown["message"]
    assert (demo.served["lookup_order"], demo.served["sleep"]) == (1, 1)


def inspector() -> Path:
    """The Inspector's ``mcp-inspector`` command, installed if need be."""
    node_and_npm()
    directory = install_dir("inspector")
    with locked(directory):
        if installed_version(directory, INSPECTOR) != INSPECTOR_VERSION:
            npm_install(directory, [f"{INSPECTOR}@{INSPECTOR_VERSION}"])
    return directory / "node_modules" / ".bin" / "mcp-inspector"


async def test_the_inspector_cli_is_served_and_refused_on_the_fast_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp.server.streamable_http_manager")
    command = str(inspector())

    def transports() -> int:
        return sum(SDK_TRANSPORT_LOG in r.getMessage() for r in caplog.records)

    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, limits={"budget": 1})) as (_, url),
    ):
        bearer = TOKENS["ops-bot"]

        async def cli(*method: str) -> tuple[int, str]:
            done = await anyio.run_process(
                [
                    command,
                    "--cli",
                    url,
                    "--transport",
                    "http",
                    *method,
                    "--header",
                    f"Authorization: Bearer {bearer}",
                ],
                check=False,
                stderr=subprocess.PIPE,
            )
            return done.returncode, done.stdout.decode()

        listed = await cli("--method", "tools/list")
        handshake = transports()  # initialize, its notification, the SSE GET, tools/list
        call = ["--method", "tools/call", "--tool-name", "sleep", "--tool-arg", "seconds=0"]
        served = await cli(*call)
        after_served = transports()
        refused = await cli(*call)
    assert listed[0] == 0 and '"lookup_order"' in listed[1]
    # The CLI lists before it calls: the same SDK requests as a listing, the call on the fast path.
    assert after_served - handshake == handshake and transports() - after_served == handshake
    assert served[0] == 0 and json.loads(served[1])["content"][0]["text"] == "sleep: done"
    # The CLI exits non-zero on an error result, after printing it whole.
    assert refused[0] != 0
    error = json.loads(refused[1][: refused[1].rindex("}") + 1])["structuredContent"]["error"]
    assert (error["code"], error["retryable"]) == ("budget_exhausted", False)
    assert demo.served["sleep"] == 1
