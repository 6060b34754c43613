"""Running a demo upstream and a gateway in this process, on loopback, and connecting to them.

Used by ``haltwire demo`` and by the tests: everything here is a real server on a real
socket, and ``connect`` (``haltwire.demo.client``) is the official MCP client over streamable HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Final

from haltwire.control import create_app as create_control_app
from haltwire.control import parse_control_config
from haltwire.demo.client import connect as connect  # here too, where the demos and tests look
from haltwire.demo.upstream import DemoUpstream
from haltwire.gateway import create_app
from haltwire.gateway.app import GatewayApp
from haltwire.gateway.ceilings import Clock
from haltwire.gateway.config import parse_config
from haltwire.listener import ListenerLimits, Parser
from haltwire.serve import serving
from haltwire.store.counters import CounterStore

#: The demo identities' plain tokens (development configs only).
TOKENS: Final = {"ops-bot": "tok-ops", "billing-bot": "tok-billing", "edge-bot": "tok-edge"}
#: The one upstream API key the gateway sends for every identity, as a shared key is.
UPSTREAM_KEY: Final = "Bearer shared-key"
#: The demo control plane's plain tokens, and its lease key (development configs only).
CONTROL_TOKENS: Final = {"operator": "tok-oncall", "gateway": "tok-gateway", "ops-bot": "tok-ops-runtime"}
LEASE_KEYS: Final = [{"kid": "demo", "secret": "demo-lease-key-never-in-production-0123456789"}]


def demo_config(upstream_url: str, **sections: Any) -> dict[str, Any]:
    """A development config: ops-bot and billing-bot with plain tokens, one shared upstream key.

    Each keyword replaces a top-level section, or is merged into it when both are tables.
    """
    data: dict[str, Any] = {
        "gateway": {"development": True},
        "identities": [
            {"agent": "ops-bot", "tenant": "acme", "version": "1.0", "token": TOKENS["ops-bot"]},
            {"agent": "billing-bot", "tenant": "acme", "version": "2.0", "token": TOKENS["billing-bot"]},
        ],
        "upstreams": [
            {"name": "demo", "url": f"{upstream_url}/mcp", "headers": {"Authorization": UPSTREAM_KEY}}
        ],
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def demo_control_config(db: Path, heartbeat_s: float = 1.0) -> dict[str, Any]:
    """A development control plane: an operator, a gateway, ops-bot's runtime, lease keys."""
    return {
        "control": {"development": True, "heartbeat_s": heartbeat_s},
        "registry": {"backend": "sqlite", "path": str(db)},
        "leases": {"signing_key": "demo", "keys": LEASE_KEYS},
        "identities": [
            {"name": "oncall", "role": "operator", "token": CONTROL_TOKENS["operator"]},
            {"name": "gateway-1", "role": "gateway", "token": CONTROL_TOKENS["gateway"]},
            {
                "name": "ops-bot-runtime",
                "role": "agent",
                "agent": "ops-bot",
                "tenant": "acme",
                "version": "1.0",
                "token": CONTROL_TOKENS["ops-bot"],
            },
        ],
    }


@asynccontextmanager
async def running_control_plane(db: Path) -> AsyncIterator[str]:
    """A control plane on its embedded default (SQLite at ``db``); yields its base URL."""
    config = parse_control_config(demo_control_config(db))
    async with serving(create_control_app(config), graceful_s=1) as url:
        yield url


@asynccontextmanager
async def running_upstream(quota: int | None = None) -> AsyncIterator[tuple[DemoUpstream, str]]:
    """A demo upstream; yields it and its base URL (its MCP endpoint is ``URL/mcp``)."""
    demo = DemoUpstream(quota=quota)
    async with serving(demo.http_app()) as url:
        yield demo, url


@asynccontextmanager
async def running_gateway(
    data: dict[str, Any],
    *,
    clock: Clock | None = None,
    store: CounterStore | None = None,
    source: str = "<demo config>",
    limits: ListenerLimits | None = None,
    parser: Parser = "auto",
) -> AsyncIterator[tuple[GatewayApp, str]]:
    """A gateway built from a config dict; yields the app and its MCP endpoint URL (``limits``
    and ``parser``: ``serving``'s; ``haltwire gateway`` serves with its ``[gateway.listener]``)."""
    config = parse_config(data, source)
    app = create_app(config, store=store) if clock is None else create_app(config, store=store, clock=clock)
    async with AsyncExitStack() as stack:
        await app.start(stack)
        async with serving(app, limits=limits, parser=parser) as url:
            yield app, f"{url}/mcp"
