"""Test helpers: a control plane with every part on (leases, broker, every role) on loopback, and
raw HTTP/1.1 requests, for tests that must send what a well-behaved client never does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2

from control_harness import ROLES, TOKEN
from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving

TOKENS = TOKEN

LEASES = {"signing_key": "k1", "keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
BROKER = {"ttl_s": 300, "audiences": ["orders"], "generate": True}


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def plane_config(registry: dict[str, Any], **control: Any) -> dict[str, Any]:
    """Every role (the agent is a1 of tenant acme, version 2.1), leases and the broker on;
    ``control``: more keys for ``[control]``."""
    identities = [
        {
            "name": f"{role}-1",
            "role": role,
            "token": TOKENS[role],
            **({"agent": "a1", "tenant": "acme", "version": "2.1"} if role == "agent" else {}),
        }
        for role in ROLES
    ]
    return {
        "control": {"development": True, **control},
        "registry": registry,
        "leases": LEASES,
        "broker": BROKER,
        "identities": identities,
    }


@asynccontextmanager
async def full_plane(
    registry: dict[str, Any], **control: Any
) -> AsyncIterator[tuple[httpx2.AsyncClient, Stores]]:
    """A control plane on loopback (``plane_config``): a client on it and its stores."""
    config = parse_control_config(plane_config(registry, **control))
    async with open_stores(config) as stores:
        async with serving(create_app(config, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
                yield client, stores


@dataclass(frozen=True)
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(
    base_url: str, head: str, chunks: Iterable[bytes] = (), within: float = 5.0
) -> RawAnswer:
    """Send ``head`` (the request line and headers, without the blank line) and ``chunks`` of
    body as they are, without finishing the body unless they do, then read one answer."""
    where = urlsplit(base_url)
    assert where.hostname is not None and where.port is not None
    stream = await anyio.connect_tcp(where.hostname, where.port)
    async with stream:
        await stream.send(head.encode("latin-1") + b"\r\n\r\n")
        for chunk in chunks:
            await stream.send(chunk)
        received = b""
        with anyio.fail_after(within):
            while b"\r\n\r\n" not in received:
                received += await stream.receive()
            top, _, body = received.partition(b"\r\n\r\n")
            status_line, *lines = top.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            while len(body) < int(headers.get("content-length", "0")):
                body += await stream.receive()
    return RawAnswer(int(status_line.split()[1]), headers, body)


def chunked(data: bytes, size: int = 65536) -> Iterable[bytes]:
    """``data`` in chunks of the chunked transfer coding, without the terminating chunk."""
    for start in range(0, len(data), size):
        piece = data[start : start + size]
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
