"""Host and Origin at the gateway's edge: DNS-rebinding protection (issue 12, point 4).

A page on ``evil.example`` whose name an attacker re-points at 127.0.0.1 makes the browser send
``Host: evil.example`` (and ``Origin: http://evil.example``) to a gateway on loopback. Real
gateway, real upstream, real HTTP requests: every method, both the fast path and the SDK's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from haltwire.config import ConfigError
from haltwire.gateway.config import parse_config
from haltwire.gateway.hosts import HostCheck
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from ports import free_port

pytestmark = pytest.mark.anyio


def _headers(
    host: str | None = None, origin: str | None = None, token: str | None = TOKENS["ops-bot"]
) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "lookup_order",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if host is not None:
        headers["Host"] = host
    if origin is not None:
        headers["Origin"] = origin
    return headers


def _call() -> bytes:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "lookup_order", "arguments": {"order_id": "A-1"}, "_meta": meta},
    }
    return json.dumps(body).encode()


def _initialize() -> bytes:
    """A handshake-era ``initialize``: the SDK's path, not the fast path."""
    params = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}).encode()


def _sdk_headers(**kwargs: Any) -> dict[str, str]:
    return {k: v for k, v in _headers(**kwargs).items() if not k.startswith(("MCP-", "Mcp-"))}


def _rejected(response: httpx2.Response, status: int, header: str) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -32600 and body["error"]["message"].startswith(f"Invalid {header} header")


async def test_a_rebinding_host_or_a_foreign_origin_is_refused_before_any_mcp_processing() -> None:
    async with running_upstream() as (demo, up), running_gateway(config_dict(up)) as (_, url):
        async with httpx2.AsyncClient() as http:
            # The fast path (a modern tools/call), with the agent's own token.
            _rejected(await http.post(url, headers=_headers("evil.example"), content=_call()), 421, "Host")
            _rejected(await http.post(url, headers=_headers("evil.example:80"), content=_call()), 421, "Host")
            # The SDK's path, every method it serves.
            sdk = _sdk_headers(host="evil.example")
            _rejected(await http.post(url, headers=sdk, content=_initialize()), 421, "Host")
            _rejected(await http.get(url, headers=sdk), 421, "Host")
            _rejected(await http.delete(url, headers=sdk), 421, "Host")
            # Checked before the token: no identity is looked up for a foreign name.
            _rejected(
                await http.post(url, headers=_headers("evil.example", token=None), content=_call()),
                421,
                "Host",
            )
            # A loopback Host, but a page from another site: the Origin is refused.
            local = url.removeprefix("http://").split("/")[0]
            for origin in ("http://evil.example", f"http://evil.example:{local.split(':')[1]}", "null"):
                _rejected(
                    await http.post(url, headers=_headers(local, origin), content=_call()), 403, "Origin"
                )
            _rejected(
                await http.post(
                    url, headers=_sdk_headers(origin="https://evil.example"), content=_initialize()
                ),
                403,
                "Origin",
            )
    assert demo.served["lookup_order"] == 0


async def test_loopback_names_are_served_on_any_port_and_local_or_same_origin_pages_too() -> None:
    async with running_upstream() as (demo, up), running_gateway(config_dict(up)) as (_, url):
        port = url.removeprefix("http://").split("/")[0].split(":")[1]
        async with httpx2.AsyncClient() as http:
            hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"]
            # Another port: a tunnel or a port mapping in front of the gateway (ssh -L 9000:...).
            hosts += ["localhost:9000", "127.0.0.1", "localhost"]
            for host in hosts:
                response = await http.post(url, headers=_headers(host), content=_call())
                assert response.status_code == 200, (host, response.text)
            # No Origin (a program, not a browser), the page's own origin, or a page on loopback.
            for origin in (
                None,
                f"http://localhost:{port}",
                "http://localhost:6274",
                "https://127.0.0.1:3000",
            ):
                response = await http.post(
                    url, headers=_headers(f"localhost:{port}", origin), content=_call()
                )
                assert response.status_code == 200, (origin, response.text)
            response = await http.post(url, headers=_sdk_headers(host=f"[::1]:{port}"), content=_initialize())
            assert response.status_code == 200
        # The official client (Host 127.0.0.1:PORT, no Origin) is served as before.
        async with connect(url, TOKENS["ops-bot"]) as client:
            assert not (await client.call_tool("lookup_order", {"order_id": "A-1"})).is_error
    assert demo.served["lookup_order"] == len(hosts) + 4 + 1


async def test_configured_hosts_and_origins_are_served_and_health_answers_any_host() -> None:
    gateway = {
        "development": True,
        "allowed_hosts": ["gw.internal:8800", "MCP.example.com", "gw.lan:*"],
        "allowed_origins": ["https://app.example.com", "http://dev.example.com:*"],
    }
    async with (
        running_upstream() as (demo, up),
        running_gateway(config_dict(up, gateway=gateway)) as (_, url),
    ):
        async with httpx2.AsyncClient() as http:
            # NAME:* is any port, or none (the scheme's default).
            for host in ("gw.internal:8800", "GW.Internal:8800", "mcp.example.com", "gw.lan:1", "gw.lan"):
                assert (await http.post(url, headers=_headers(host), content=_call())).status_code == 200, (
                    host
                )
            for host in ("gw.internal:8801", "gw.internal", "mcp.example.com:443", "gw.lan:x", "x.gw.lan:1"):
                _rejected(await http.post(url, headers=_headers(host), content=_call()), 421, "Host")
            for origin in (
                "https://app.example.com",
                "http://dev.example.com:5173",
                "https://mcp.example.com",
            ):
                response = await http.post(url, headers=_headers("mcp.example.com", origin), content=_call())
                assert response.status_code == 200, origin
            for origin in (
                "http://app.example.com",
                "https://app.example.com:8443",
                "https://dev.example.com:1",
            ):
                response = await http.post(url, headers=_headers("mcp.example.com", origin), content=_call())
                _rejected(response, 403, "Origin")
            # Load balancers and orchestrators probe /healthz by address: it answers any Host.
            health = await http.get(url.removesuffix("/mcp") + "/healthz", headers={"Host": "10.1.2.3:8800"})
            assert health.status_code == 200 and health.json() == {"ok": True}
    assert demo.served["lookup_order"] == 5 + 3


def test_the_default_list_is_loopback_and_the_bind_host_unless_a_wildcard() -> None:
    check = HostCheck((), (), bind_host="10.1.2.3")
    assert check.host_allowed(b"10.1.2.3:8800") and check.host_allowed(b"10.1.2.3")
    assert check.host_allowed(b"localhost:1") and check.host_allowed(b"[::1]:8800")
    assert not check.host_allowed(b"10.1.2.4:8800") and not check.host_allowed(None)
    assert not check.host_allowed(b"") and not check.host_allowed(b"localhost:x")
    assert not check.host_allowed(b"localhost.:8800") and not check.host_allowed(b"evil.localhost:8800")
    for wildcard in ("0.0.0.0", "::", ""):
        check = HostCheck((), (), bind_host=wildcard)
        assert not check.host_allowed(b"0.0.0.0:8800") and not check.host_allowed(b"[::]:8800")
    assert HostCheck((), (), bind_host="::1").host_allowed(b"[::1]:8800")
    assert HostCheck((), (), bind_host="GW.Internal").host_allowed(b"gw.internal:8800")
    # Origins: absent, the request's own, loopback pages, then the list.
    check = HostCheck((), ("https://app.example.com",), bind_host="127.0.0.1")
    assert check.origin_allowed(None, b"gw:1") and check.origin_allowed(b"https://gw:1", b"gw:1")
    assert check.origin_allowed(b"http://[::1]:3000", b"gw:1") and check.origin_allowed(
        b"https://app.example.com", b"x"
    )
    assert not check.origin_allowed(b"null", b"gw:1") and not check.origin_allowed(b"http://gw:2", b"gw:1")
    assert not check.origin_allowed(b"gw:1", b"gw:1") and not check.origin_allowed(b"", b"gw:1")


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("allowed_hosts", "*", "a wildcard"),
        ("allowed_hosts", "*.example.com", "a wildcard"),
        ("allowed_hosts", "http://gw.internal:8800", "no scheme or path"),
        ("allowed_hosts", "gw.internal/mcp", "no scheme or path"),
        ("allowed_hosts", "::1", "in brackets"),
        ("allowed_hosts", "gw.internal:0", "a port from 1 to 65535"),
        ("allowed_hosts", "gw.internal:99999", "a port from 1 to 65535"),
        ("allowed_hosts", "gw internal", "not a host name"),
        ("allowed_hosts", "", "not a host name"),
        ("allowed_origins", "*", "a wildcard"),
        ("allowed_origins", "null", "'null'"),
        ("allowed_origins", "https://app.example.com/", "without a path"),
        ("allowed_origins", "app.example.com", "starts with its scheme"),
        ("allowed_origins", "https://*.example.com", "a wildcard"),
    ],
)
def test_bad_entries_are_config_errors_naming_the_key(key: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            config_dict("http://127.0.0.1:1", gateway={"development": True, key: [value]}), "gw.toml"
        )
    message = str(err.value)
    assert message.startswith(f"gw.toml: gateway.{key}[0]: ") and problem in message, message


def test_entries_are_lower_cased_and_default_ports_of_origins_dropped() -> None:
    gateway = {
        "allowed_hosts": ["GW.internal:8800", "[::1]:*", "10.0.0.5"],
        "allowed_origins": ["HTTPS://App.Example.com:443", "http://x.example:80", "http://y.example:8080"],
    }
    section = parse_config(config_dict("http://127.0.0.1:1", gateway=gateway)).gateway
    assert section.allowed_hosts == ["gw.internal:8800", "[::1]:*", "10.0.0.5"]
    assert section.allowed_origins == ["https://app.example.com", "http://x.example", "http://y.example:8080"]


async def test_the_cli_serves_its_bind_host_given_by_host_and_the_toml_keys(tmp_path: Path) -> None:
    """``haltwire gateway --host`` on another loopback address: that name is served, and the TOML's."""
    port = free_port()
    async with running_upstream() as (demo, up):
        config = tmp_path / "gateway.toml"
        config.write_text(
            '[gateway]\ndevelopment = true\nallowed_hosts = ["gw.internal:*"]\n'
            f'[[identities]]\nagent = "ops-bot"\ntoken = "{TOKENS["ops-bot"]}"\n'
            f'[[upstreams]]\nname = "demo"\nurl = "{up}/mcp"\n'
        )
        argv = [sys.executable, "-m", "haltwire", "gateway", "--config", str(config), "--host", "127.0.0.2"]
        log = tmp_path / "gateway.log"
        with log.open("wb") as stderr:
            proc = await anyio.open_process([*argv, "--port", str(port)], stdout=None, stderr=stderr)
        try:
            url = f"http://127.0.0.2:{port}/mcp"
            async with httpx2.AsyncClient() as http:
                with anyio.fail_after(30):
                    while True:
                        try:
                            if (await http.get(f"http://127.0.0.2:{port}/healthz")).status_code == 200:
                                break
                        except httpx2.TransportError:
                            assert proc.returncode is None, log.read_text()
                            await anyio.sleep(0.1)
                for host in (f"127.0.0.2:{port}", "gw.internal:8800", f"localhost:{port}"):
                    assert (await http.post(url, headers=_headers(host), content=_call())).status_code == 200
                _rejected(await http.post(url, headers=_headers("127.0.0.3"), content=_call()), 421, "Host")
        finally:
            proc.terminate()
            with anyio.fail_after(10):
                await proc.wait()
    assert "refused a request with Host '127.0.0.3'" in log.read_text(), log.read_text()
    assert demo.served["lookup_order"] == 3
