"""The example's servers on loopback, in this process: a control plane (SQLite in a temporary
directory), the demo upstream, a gateway in front of it that requires a lease and routes the
model ``fake-model`` to the scripted Responses endpoint (``fake_model.py``), and that endpoint;
and what the operator does there: issue a stop, read the run's report.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from examples.openai_agents.fake_model import FakeResponses

from haltwire.control import create_app, parse_control_config
from haltwire.demo.stack import demo_config, running_gateway, running_upstream
from haltwire.demo.upstream import DemoUpstream
from haltwire.serve import serving

OPERATOR_TOKEN = "tok-oncall"
GATEWAY_TOKEN = "tok-gateway"
#: The runtime's identity at the control plane; the same agent, tenant and version as the
#: gateway's ops-bot, so the gateway accepts this run's leases from ops-bot's calls.
RUNTIME_TOKEN = "tok-ops-runtime"
MCP_TOKEN = "tok-ops"
LEASE_SECRET = "example-lease-key-" + "x" * 32
#: The fake provider's key, which only the gateway holds (read from this variable at its start).
MODEL_KEY_ENV = "HALTWIRE_EXAMPLE_MODEL_KEY"
REASON = "refund storm: the agent keeps looking up orders"


def control_config(db: Path) -> dict[str, Any]:
    return {
        "control": {"development": True, "heartbeat_s": 1.0},
        "registry": {"backend": "sqlite", "path": str(db)},
        "agent_classes": {"default": {"ttl_s": 15, "renew_every_s": 5, "renew_timeout_s": 10}},
        "leases": {"signing_key": "k1", "keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        "identities": [
            {"name": "oncall", "role": "operator", "token": OPERATOR_TOKEN},
            {"name": "gateway-1", "role": "gateway", "token": GATEWAY_TOKEN},
            {
                "name": "ops-runtime",
                "role": "agent",
                "token": RUNTIME_TOKEN,
                "agent": "ops-bot",
                "tenant": "acme",
                "version": "1.0",
            },
        ],
    }


def gateway_config(upstream: str, control: str, model: str) -> dict[str, Any]:
    data = demo_config(
        upstream,
        # A stop reaches the gateway on its watch at once; staleness_s is how long a silent watch
        # is trusted (heartbeats every 1 s): 5 s rides out a loaded machine's stalls.
        control={"url": control, "token": GATEWAY_TOKEN, "staleness_s": 5.0},
        leases={"keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        models=[{"name": "fake", "base_url": f"{model}/v1", "api_key_env": MODEL_KEY_ENV, "models": ["fake-model"]}],
    )
    data["identities"][0]["lease"] = "required"  # ops-bot: no lease, no tool call
    return data


async def operator_stop(control_url: str, scope: str, reason: str) -> dict[str, Any]:
    """``POST /v1/stops`` as the operator would (``haltwire stop`` does the same)."""
    async with httpx2.AsyncClient(base_url=control_url, timeout=10) as http:
        r = await http.post(
            "/v1/stops",
            json={"scope": scope, "reason": reason},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
    r.raise_for_status()
    issued: dict[str, Any] = r.json()
    return issued


@dataclass
class Stack:
    control_url: str
    demo: DemoUpstream
    mcp_url: str
    model: FakeResponses
    #: The gateway's base URL: its model endpoints are under ``/v1``.
    gateway_url: str


@asynccontextmanager
async def running_stack(workdir: Path, model: FakeResponses) -> AsyncIterator[Stack]:
    """Control plane, demo upstream, gateway (lease required) and ``model``, on loopback."""
    app = create_app(parse_control_config(control_config(workdir / "control.db")))
    os.environ.setdefault(MODEL_KEY_ENV, "fake-provider-key")
    async with (
        serving(app, graceful_s=1) as control_url,
        running_upstream() as (demo, upstream_url),
        serving(model.app()) as model_url,
        running_gateway(gateway_config(upstream_url, control_url, model_url)) as (_, mcp_url),
    ):
        yield Stack(control_url, demo, mcp_url, model, mcp_url.removesuffix("/mcp"))



async def reported_calls(control_url: str, run_id: str, wait_s: float = 10.0) -> list[dict[str, Any]]:
    """The calls a stop found in flight, from the run's report (``GET /v1/runs/{id}/report``),
    once the gateway has reported one (it does so off the call path): ``[]`` after ``wait_s``."""
    calls: list[dict[str, Any]] = []
    async with httpx2.AsyncClient(base_url=control_url, timeout=10) as http:
        with anyio.move_on_after(wait_s):
            while not calls:
                r = await http.get(
                    f"/v1/runs/{run_id}/report", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
                )
                r.raise_for_status()
                calls = r.json()["calls"]
                if not calls:
                    await anyio.sleep(0.05)
    return calls
