"""The official MCP client over streamable HTTP with a bearer token: what the demos, the tests
and ``haltwire call`` connect with (light to import: no server of haltwire's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def connect(url: str, token: str | None, **client_kwargs: Any) -> AsyncIterator[Client]:
    """The official MCP client, sending ``token`` as its bearer token on every request."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
    async with (
        http,
        Client(streamable_http_client(url, http_client=http), cache=None, **client_kwargs) as client,
    ):
        yield client
