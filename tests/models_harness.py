"""A gateway with ``[[models]]`` in front of the scripted provider (``model_provider``), each served
by uvicorn on loopback, optionally with a control plane; and the official ``openai`` client."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2
import openai
from starlette.types import Receive, Scope, Send

from control_harness import auth
from control_harness import config_dict as control_config
from haltwire.control import create_app as create_control_app
from haltwire.control import parse_control_config
from haltwire.demo.stack import CONTROL_TOKENS, LEASE_KEYS, running_control_plane
from haltwire.gateway import create_app
from haltwire.gateway.app import GatewayApp
from haltwire.gateway.config import parse_config
from haltwire.identity import Identity
from haltwire.listener import ListenerLimits
from haltwire.serve import serving
from haltwire.tokens import LeaseClaims, LeaseKeys
from harness import TOKENS, config_dict, running_upstream
from model_provider import ScriptedProvider

#: The provider's key, in the environment variable the config names; never to be seen by a client.
KEY_ENV: Final = "HALTWIRE_TEST_MODEL_KEY"
PROVIDER_KEY: Final = "sk-provider-secret-0123456789"
OPS: Final = Identity("ops-bot", "acme", "1.0")
HEARTBEAT_S: Final = 0.2
#: No model test is about a stale watch; on a loaded machine the whole stack, on one event
#: loop, can pause past 1 s, which made the watch stale in the middle of a test.
STALENESS_S: Final = 5.0
#: A lease key for gateways that verify leases (``[leases]``), and the run its tokens name.
LEASE_SECRET: Final = "k1-" + "m" * 40
LEASES: Final = {"keys": [{"kid": "k1", "secret": LEASE_SECRET}]}


class Counted:
    """An ASGI app that counts the requests that reached it, by path."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self.requests: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.requests[scope["path"]] += 1
        await self.app(scope, receive, send)


@dataclass
class Stack:
    provider: ScriptedProvider
    app: GatewayApp
    counted: Counted
    base_url: str  # the gateway's OpenAI base URL (``.../v1``)
    control: str | None
    #: The control plane's operator token (``control_harness``'s, or the demo's with ``runs``).
    operator: dict[str, str] = field(default_factory=lambda: auth("operator"))
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(self, agent: str = "ops-bot", *, token: str | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
        """The official client as ``agent``: its haltwire token is its API key (closed with the stack)."""
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=token or TOKENS[agent], **kwargs)
        self.clients.append(client)
        return client

    async def stop(self, scope: str, reason: str = "runaway") -> dict[str, Any]:
        assert self.control is not None
        async with httpx2.AsyncClient(base_url=self.control, timeout=10) as http:
            r = await http.post("/v1/stops", json={"scope": scope, "reason": reason}, headers=self.operator)
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body

    async def clear(self, stop_id: str) -> None:
        assert self.control is not None
        async with httpx2.AsyncClient(base_url=self.control, timeout=10) as http:
            r = await http.post(f"/v1/stops/{stop_id}/clear", json={"reason": "ok"}, headers=self.operator)
        assert r.status_code == 200, r.text


def lease_token(run: str, identity: Identity = OPS) -> str:
    """A lease for ``run`` signed with ``LEASE_SECRET`` (``LEASES``, a gateway's ``[leases]``)."""
    now = time.time()
    keys = LeaseKeys({"k1": LEASE_SECRET.encode()}, signing="k1")
    return keys.sign(LeaseClaims(run, identity.agent, identity.tenant, identity.version, 0, now, now + 60))


def models_section(
    provider_url: str, prices: dict[str, Any] | None = None, **options: Any
) -> list[dict[str, Any]]:
    entry = {
        "name": "scripted",
        "base_url": f"{provider_url}/v1",
        "api_key_env": KEY_ENV,
        "models": ["gpt-test"],
        "prefixes": ["scripted-"],
        **options,
    }
    return [{**entry, "prices": prices} if prices else entry]


@asynccontextmanager
async def model_stack(
    tmp_path: Path,
    *,
    control: bool = False,
    runs: bool = False,
    provider_url: str | None = None,
    prices: dict[str, Any] | None = None,
    model_options: dict[str, Any] | None = None,
    listener: ListenerLimits | None = None,
    **sections: Any,
) -> AsyncIterator[Stack]:
    """The scripted provider, a demo upstream, a gateway routing ``gpt-test`` and ``scripted-*`` to
    the provider (``provider_url`` instead: another one), and with ``control`` a control plane;
    with ``runs`` the demo's control plane, which grants ops-bot leases the gateway verifies. With
    ``listener``, the gateway is served on haltwire's listener, as ``haltwire gateway`` serves it."""
    os.environ[KEY_ENV] = PROVIDER_KEY
    provider = ScriptedProvider()
    async with AsyncExitStack() as stack:
        purl = await stack.enter_async_context(serving(provider))
        _, up = await stack.enter_async_context(running_upstream())
        cp = None
        operator = auth("operator")
        if runs:
            cp = await stack.enter_async_context(running_control_plane(tmp_path / "control.db"))
            sections["control"] = {"url": cp, "token": CONTROL_TOKENS["gateway"], "staleness_s": 5.0}
            sections["leases"] = {"keys": LEASE_KEYS}
            operator = {"Authorization": f"Bearer {CONTROL_TOKENS['operator']}"}
        elif control:
            data = control_config({"backend": "sqlite", "path": str(tmp_path / "control.db")}, HEARTBEAT_S)
            cp = await stack.enter_async_context(
                serving(create_control_app(parse_control_config(data)), graceful_s=1)
            )
            sections["control"] = {"url": cp, "token": "tok-gateway", "staleness_s": STALENESS_S}
        sections.setdefault("models", models_section(provider_url or purl, prices, **(model_options or {})))
        app = create_app(parse_config(config_dict(up, **sections)))
        await app.start(stack)
        counted = Counted(app)
        url = await stack.enter_async_context(serving(counted, limits=listener))
        built = Stack(provider, app, counted, f"{url}/v1", cp, operator)
        try:
            yield built
        finally:
            for client in built.clients:
                await client.close()


async def refused(
    s: Stack, agent: str = "ops-bot", model: str = "gpt-test", **headers: str
) -> dict[str, Any] | None:
    """The error body of one whole chat call to ``model`` (no retries), or None when it was served."""
    try:
        await s.client(agent, max_retries=0, default_headers=headers).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    except openai.APIStatusError as exc:
        assert isinstance(exc.body, dict)
        return exc.body
    return None


async def until_refused(s: Stack, code: str, agent: str = "ops-bot", model: str = "gpt-test") -> None:
    """Wait (5 s at most) until a call to ``model`` is refused ``code``: a stop has reached the gateway."""
    with anyio.fail_after(5):
        while ((await refused(s, agent, model)) or {}).get("code") != code:
            await anyio.sleep(0.05)

