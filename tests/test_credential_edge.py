"""A stopped or fenced broker credential is refused at the gateway's edge on every request, not
only on ``tools/call`` (issue 12, point 7): the credential is revoked, so it authenticates
nothing, whatever the method, the protocol version, the HTTP verb, or a batch.

Real control plane (SQLite), demo upstream and gateway with ``[broker]`` (``test_broker.gateway_stack``).
"""

from __future__ import annotations

import json
from typing import Any, Final

import anyio
import anyio.abc
import httpx2
import pytest

from broker_harness import PROPAGATION_S, gateway_stack, issued, mcp_client, refusal_of
from haltwire.control import create_app, parse_control_config
from haltwire.serve import serving
from harness import TOKENS
from runs_harness import clear, issue, register
from stops_harness import until

pytestmark = pytest.mark.anyio

MODERN: Final = "2026-07-28"
LEGACY: Final = "2025-11-25"
ENVELOPE: Final = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rpc(method: str, request_id: int | None = 1, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params:
        message["params"] = params
    return message


#: (name, HTTP method, MCP-Protocol-Version, body): every kind of request an MCP client sends
#: but a tool call, on both protocol versions, and a batch.
REQUESTS: Final[list[tuple[str, str, str | None, Any]]] = [
    ("initialize", "POST", None, rpc("initialize", protocolVersion=LEGACY, capabilities={},
                                     clientInfo={"name": "t", "version": "1"})),
    ("initialized", "POST", LEGACY, rpc("notifications/initialized", None)),
    ("tools/list legacy", "POST", LEGACY, rpc("tools/list")),
    ("tools/list modern", "POST", MODERN, rpc("tools/list", _meta=ENVELOPE)),
    ("ping", "POST", LEGACY, rpc("ping")),
    ("resources/list", "POST", LEGACY, rpc("resources/list")),
    ("prompts/list", "POST", MODERN, rpc("prompts/list", _meta=ENVELOPE)),
    ("server/discover", "POST", MODERN, rpc("server/discover", _meta=ENVELOPE)),
    ("batch", "POST", LEGACY, [rpc("tools/list", 1), rpc("ping", 2)]),
    ("a batch holding a tool call", "POST", LEGACY,
     [rpc("tools/call", 1, name="lookup_order", arguments={"order_id": "A-1"}), rpc("tools/list", 2)]),
    ("not JSON", "POST", LEGACY, "{not json"),
    ("GET stream", "GET", LEGACY, None),
    ("DELETE session", "DELETE", LEGACY, None),
]


async def send(url: str, token: str, method: str, version: str | None, body: Any) -> httpx2.Response:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    if version is not None:
        headers["MCP-Protocol-Version"] = version
    if isinstance(body, dict) and version == MODERN:
        headers["Mcp-Method"] = body["method"]
        if "name" in body.get("params", {}):
            headers["Mcp-Name"] = body["params"]["name"]
    content = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.request(method, url, content=content, headers=headers)


async def refused_everywhere(url: str, token: str, code: str) -> None:
    """Every request of ``REQUESTS`` with ``token`` is refused at the edge with ``code``."""
    for name, method, version, body in REQUESTS:
        r = await send(url, token, method, version, body)
        assert r.status_code == 403, (name, r.status_code, r.text)
        error = r.json()["error"]
        assert (error["code"], error["retryable"]) == (code, False), (name, r.text)


async def test_a_stopped_or_fenced_credential_is_refused_on_every_method(tmp_path: Any) -> None:
    async with gateway_stack(tmp_path) as (client, url, demo):
        await register(client, run_id="r-1")
        await register(client, run_id="r-2")
        old = await issued(client, "r-1", audience="haltwire-gateway")
        other = await issued(client, "r-2", audience="haltwire-gateway")
        # Served before the stop: the listing and the discovery of both protocol versions.
        for name, method, version, body in REQUESTS[:5]:
            r = await send(url, old, method, version, body)
            assert r.status_code in (200, 202), (name, r.status_code, r.text)

        stop = await issue(client, "run:r-1")

        async def refused() -> bool:
            r = await send(url, old, "POST", MODERN, rpc("tools/list", _meta=ENVELOPE))
            return r.status_code == 403

        await until(refused, PROPAGATION_S)
        await refused_everywhere(url, old, "stopped")
        r = await send(url, old, "POST", LEGACY, rpc("tools/list"))
        error = r.json()["error"]
        assert (error["scope"], error["stop_id"]) == ("run:r-1", stop["stop_id"])
        # A tool call is still answered as the pipeline answers it: a tool result the agent reads.
        for path in ("fast", "sdk"):
            async with mcp_client(url, other, path) as c:  # connected with a credential still good
                assert await refusal_of(c) is None
        r = await send(
            url, old, "POST", MODERN,
            rpc("tools/call", name="lookup_order", arguments={"order_id": "A-1"}, _meta=ENVELOPE),
        )
        assert r.status_code == 200, r.text
        assert r.json()["result"]["structuredContent"]["error"]["code"] == "stopped"
        # Another run's credential, and the agent's own token outside the run, are served.
        for token in (other, TOKENS["ops-bot"]):
            r = await send(url, token, "POST", LEGACY, rpc("tools/list"))
            assert r.status_code == 200, r.text

        # Cleared: the credential issued before the stop stays dead (fenced), everywhere.
        await clear(client, stop["stop_id"])

        async def fenced() -> bool:
            r = await send(url, old, "POST", LEGACY, rpc("tools/list"))
            return r.status_code == 403 and r.json()["error"]["code"] == "lease_invalid"

        await until(fenced, PROPAGATION_S)
        await refused_everywhere(url, old, "lease_invalid")
        fresh = await issued(client, "r-1", audience="haltwire-gateway")
        r = await send(url, fresh, "POST", LEGACY, rpc("tools/list"))
        assert r.status_code == 200, r.text
        assert demo.served.get("lookup_order", 0) == 2  # the two calls by the good credential


@pytest.mark.parametrize("scope", ["agent:ops-bot", "tenant:acme", "version:ops-bot@1.0", "global"])
async def test_a_stop_on_the_runs_other_scopes_refuses_its_credential_everywhere(
    tmp_path: Any, scope: str
) -> None:
    async with gateway_stack(tmp_path) as (client, url, _):
        await register(client, run_id="r-1")
        token = await issued(client, "r-1", audience="haltwire-gateway")
        await issue(client, scope)

        async def refused() -> bool:
            r = await send(url, token, "POST", LEGACY, rpc("ping"))
            return r.status_code == 403

        await until(refused, PROPAGATION_S)
        await refused_everywhere(url, token, "stopped")
        # A tool stop is not a run's: it refuses calls to the tool, not the credential's listing.
        r = await send(url, token, "POST", LEGACY, rpc("tools/list"))
        assert r.json()["error"]["scope"] == scope


async def test_a_tool_stop_leaves_a_credentials_other_requests_alone(tmp_path: Any) -> None:
    async with gateway_stack(tmp_path) as (client, url, _):
        await register(client, run_id="r-1")
        token = await issued(client, "r-1", audience="haltwire-gateway")
        await issue(client, "tool:lookup_order")
        async with mcp_client(url, token, "fast") as c:

            async def stopped() -> bool:
                error = await refusal_of(c)
                return error is not None and error["code"] == "stopped"

            await until(stopped, PROPAGATION_S)
            assert (await c.list_tools()).tools
        r = await send(url, token, "POST", LEGACY, rpc("tools/list"))
        assert r.status_code == 200, r.text


async def test_a_credential_is_refused_while_the_gateway_cannot_hear_stops(tmp_path: Any) -> None:
    """Fail closed: with the watch stale, a stop on the credential's run could not be known."""
    from broker_harness import gateway_stack_plane
    from harness import running_gateway, running_upstream
    from stops_harness import STALENESS_S, gateway_config

    data = gateway_stack_plane(tmp_path, ["haltwire-gateway"])
    gone = anyio.Event()

    async def plane(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with serving(create_app(parse_control_config(data)), graceful_s=1) as cp:
            task_status.started(cp)
            await gone.wait()

    async with running_upstream() as (_, up), anyio.create_task_group() as tg:
        cp = await tg.start(plane)
        async with httpx2.AsyncClient(base_url=cp, timeout=10) as client:
            await register(client, run_id="r-1")
            token = await issued(client, "r-1", audience="haltwire-gateway")
        config = {**gateway_config(up, cp), "broker": {"jwks_url": cp + "/.well-known/jwks.json"}}
        async with running_gateway(config) as (_, url):
            r = await send(url, token, "POST", LEGACY, rpc("tools/list"))
            assert r.status_code == 200, r.text
            gone.set()

            async def stale() -> bool:
                r = await send(url, token, "POST", LEGACY, rpc("tools/list"))
                return r.status_code == 503

            await until(stale, STALENESS_S + 3.0)
            r = await send(url, token, "POST", MODERN, rpc("tools/list", _meta=ENVELOPE))
            error = r.json()["error"]
            assert (r.status_code, error["code"], error["retryable"]) == (503, "registry_unreachable", True)
            assert r.headers["retry-after"]
            # The gateway's own identities list tools as before (their calls are refused, not this).
            r = await send(url, TOKENS["ops-bot"], "POST", LEGACY, rpc("tools/list"))
            assert r.status_code == 200, r.text
