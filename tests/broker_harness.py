"""Helpers for tests of the credential broker: broker sections with Ed25519 key files, a control
plane with the broker, the example downstream service verifying credentials, and a gateway
stack that takes broker credentials as bearer tokens."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx2
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from control_harness import TOKEN
from control_harness import config_dict as control_config
from haltwire.control import create_app, parse_control_config
from haltwire.control.stores import open_stores
from haltwire.credentials import CredentialVerifier
from haltwire.serve import serving
from harness import running_gateway, running_upstream
from leases_harness import PATHS
from runs_harness import auth, config_dict
from stops_harness import HEARTBEAT_S, gateway_config

ROOT = Path(__file__).resolve().parent.parent
#: A generous bound for a stop to reach the downstream service (it is milliseconds here).
PROPAGATION_S = 2.0


def downstream_module() -> ModuleType:
    """``examples/downstream/app.py``, which is not a package."""
    spec = importlib.util.spec_from_file_location("downstream_app", ROOT / "examples/downstream/app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOWNSTREAM = downstream_module()


def key_file(tmp_path: Path, kid: str) -> Path:
    """An Ed25519 private key in PEM, written once per test directory and kid."""
    path = tmp_path / f"{kid}.pem"
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_bytes(pem)
    return path


def broker(tmp_path: Path, kids: tuple[str, ...] = ("k1",), signing: str = "k1") -> dict[str, Any]:
    return {
        "ttl_s": 600,
        "audiences": ["orders", "billing"],
        "signing_key": signing,
        "keys": [{"kid": kid, "private_key_file": str(key_file(tmp_path, kid))} for kid in kids],
    }


@asynccontextmanager
async def plane(
    registry: dict[str, Any], section: dict[str, Any] | None, port: int = 0, graceful_s: int | None = None
) -> AsyncIterator[httpx2.AsyncClient]:
    data = config_dict(registry)
    data["control"]["heartbeat_s"] = 1.0
    if section is not None:
        data["broker"] = section
    config = parse_control_config(data)
    async with open_stores(config) as stores:
        async with serving(create_app(config, stores), port=port, graceful_s=graceful_s) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client


@asynccontextmanager
async def downstream(
    control: httpx2.AsyncClient, audience: str = "orders", **options: Any
) -> AsyncIterator[tuple[httpx2.AsyncClient, CredentialVerifier]]:
    """The example downstream service, verifying with a viewer's watch of ``control``."""
    url = str(control.base_url).rstrip("/")
    verifier = CredentialVerifier.connect(url, TOKEN["viewer"], audience, **options)
    async with serving(DOWNSTREAM.create_app(verifier)) as base:
        async with httpx2.AsyncClient(base_url=base, timeout=10) as client:
            yield client, verifier


async def credential(
    client: httpx2.AsyncClient, run_id: str, who: str = "agent", audience: str = "orders"
) -> httpx2.Response:
    return await client.post(f"/v1/runs/{run_id}/credentials", json={"audience": audience}, headers=auth(who))


async def issued(
    client: httpx2.AsyncClient, run_id: str, who: str = "agent", audience: str = "orders"
) -> str:
    r = await credential(client, run_id, who, audience)
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


async def order(service: httpx2.AsyncClient, token: str | None) -> httpx2.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return await service.get("/orders/1001", headers=headers)


def code_of(r: httpx2.Response) -> str:
    code: str = r.json()["error"]["code"]
    return code


async def until_status(service: httpx2.AsyncClient, token: str, status: int, within: float) -> float:
    """Poll the service until ``token`` gets ``status``; the seconds it took."""
    start = time.monotonic()
    with anyio.fail_after(within):
        while (await order(service, token)).status_code != status:
            await anyio.sleep(0.02)
    return time.monotonic() - start


def gateway_stack_plane(tmp_path: Path, audiences: list[str]) -> dict[str, Any]:
    """The control plane's config for a gateway stack: the agent identity is the harness's
    ops-bot, leases on, the broker issuing for ``audiences``; a fast heartbeat."""
    data = control_config({"backend": "sqlite", "path": str(tmp_path / "c.db")}, HEARTBEAT_S)
    for identity in data["identities"]:
        if identity["role"] == "agent":
            identity.update(agent="ops-bot", tenant="acme", version="1.0")
    data["leases"] = {"signing_key": "k1", "keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
    data["broker"] = {**broker(tmp_path), "audiences": audiences}
    return data


@asynccontextmanager
async def gateway_stack(tmp_path: Path) -> AsyncIterator[tuple[httpx2.AsyncClient, str, Any]]:
    """A control plane (the agent identity is the harness's ops-bot), the demo upstream, and a
    gateway taking broker credentials for audience haltwire-gateway: (control client, gateway
    URL, the demo upstream)."""
    data = gateway_stack_plane(tmp_path, ["haltwire-gateway", "orders"])
    data["identities"].append(
        {"name": "stranger", "role": "agent", "token": "tok-stranger", "agent": "nobody"}
    )
    async with serving(create_app(parse_control_config(data)), graceful_s=1) as cp:
        async with running_upstream() as (demo, up):
            config = {**gateway_config(up, cp), "broker": {"jwks_url": cp + "/.well-known/jwks.json"}}
            async with (
                running_gateway(config) as (_, url),
                httpx2.AsyncClient(base_url=cp, timeout=10) as client,
            ):
                yield client, url, demo


@asynccontextmanager
async def mcp_client(url: str, bearer: str, path: str) -> AsyncIterator[Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
    async with http, Client(streamable_http_client(url, http_client=http), cache=None, mode=PATHS[path]) as c:
        yield c


async def refusal_of(c: Any) -> dict[str, Any] | None:
    result = await c.call_tool("lookup_order", {"order_id": "A-1"})
    if not result.is_error:
        return None
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error
