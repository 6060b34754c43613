"""Helpers for tests of the gateway's lease checks: lease tokens minted exactly as the control
plane signs them (and tampered with), the gateway's clock, and an MCP client on either path
(the fast path or the SDK server path)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from haltwire.meta import LEASE_META, RUN_META
from haltwire.tokens import LeaseClaims, LeaseKeys
from harness import TOKENS

SECRET_1 = "k1-" + "a" * 40
SECRET_2 = "k2-" + "b" * 40
K1 = LeaseKeys({"k1": SECRET_1.encode()}, signing="k1")
K2 = LeaseKeys({"k2": SECRET_2.encode()}, signing="k2")
LEASES = {"keys": [{"kid": "k1", "secret": SECRET_1}]}
# ops-bot is tenant acme, version 1.0; billing-bot is tenant acme, version 2.0 (harness).
IDENTITY = {"ops-bot": ("acme", "1.0"), "billing-bot": ("acme", "2.0")}
PATHS = {"fast": "2026-07-28", "sdk": "legacy"}


class GatewayClock:
    """The gateway's clock: real time plus an offset a test moves."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def mint(
    run: str = "run-1",
    agent: str = "ops-bot",
    *,
    keys: LeaseKeys = K1,
    generation: int = 0,
    issued_at: float | None = None,
    ttl_s: float = 60.0,
) -> str:
    tenant, version = IDENTITY[agent]
    iat = time.time() if issued_at is None else issued_at
    claims = LeaseClaims(run, agent, tenant, version, generation, iat, iat + ttl_s)
    return keys.sign(claims)


def tamper(token: str, **changes: Any) -> str:
    """The token with its payload changed and its signature kept."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims.update(changes)
    raw = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{raw}.{signature}"


@asynccontextmanager
async def client(
    url: str, agent: str = "ops-bot", *, path: str = "fast", lease_header: str | None = None
) -> AsyncIterator[Client]:
    """The official MCP client as ``agent``, on ``path``, optionally sending a Haltwire-Lease header."""
    headers = {"Authorization": f"Bearer {TOKENS[agent]}"}
    if lease_header is not None:
        headers["Haltwire-Lease"] = lease_header
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, cache=None, mode=PATHS[path]) as c:
        yield c


async def call(c: Client, token: object = None, run: object = None) -> dict[str, Any] | None:
    """The refusal's error object, or None when the call was served."""
    meta: dict[str, Any] = {}
    if token is not None:
        meta[LEASE_META] = token
    if run is not None:
        meta[RUN_META] = run
    result = await c.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta or None)  # type: ignore[arg-type]
    if not result.is_error:
        return None
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error


def code(error: dict[str, Any] | None) -> str | None:
    return None if error is None else str(error["code"])
