"""The stack of ``haltwire demo refunds``: the control plane, the shop, the gateway and the
executor, each its own process on loopback, and the development configs they read.

The control plane gives agent class ``support`` a 10-second lease, runs the credential broker
and enforces the per-run limit of ``PER_RUN`` ``issue_refund`` intents; the gateway requires a
lease and records the shop's irreversible calls as intents, which the executor commits.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import tomli_w

from haltwire.demo.processes import Processes, free_port
from haltwire.demo.support_agent import AUDIENCE

#: The per-run limit the control plane enforces on ``issue_refund`` intents.
PER_RUN: Final = 5
#: Plain tokens and the lease key of the demo's development configs.
TOKENS: Final = {
    "operator": "tok-refunds-oncall",
    "gateway": "tok-refunds-gateway",
    "executor": "tok-refunds-executor",
    "runtime": "tok-refunds-runtime",
    "agent": "tok-refunds-support",
}
LEASE_KEY: Final = {"kid": "demo", "secret": "demo-refunds-lease-key-never-in-production-0123"}
EXECUTOR: Final = "executor-1"
AGENT: Final = "support-bot"


# -- the configs -------------------------------------------------------------------------------


def control_config(db: Path, port: int, enforcement_port: int) -> dict[str, Any]:
    """The control plane: a 10-second lease for ``support``, the broker, the per-run limit."""
    return {
        "control": {
            "development": True,
            "port": port,
            "admin_port": 0,
            "enforcement_port": enforcement_port,
            "heartbeat_s": 1.0,
        },
        "registry": {"backend": "sqlite", "path": str(db)},
        "leases": {"signing_key": LEASE_KEY["kid"], "keys": [LEASE_KEY]},
        "agent_classes": {
            "default": {"ttl_s": 15.0, "renew_every_s": 5.0, "renew_timeout_s": 10.0},
            "support": {"ttl_s": 10.0, "renew_every_s": 3.0, "renew_timeout_s": 8.0},
        },
        "broker": {"audiences": [AUDIENCE], "generate": True, "ttl_s": 300.0},
        "intent_limits": [{"tool": "issue_refund", "per_run": PER_RUN}],
        "identities": [
            {"name": "oncall", "role": "operator", "token": TOKENS["operator"]},
            {"name": "gateway-1", "role": "gateway", "token": TOKENS["gateway"]},
            {"name": EXECUTOR, "role": "executor", "token": TOKENS["executor"]},
            {
                "name": "support-runtime",
                "role": "agent",
                "agent": AGENT,
                "tenant": "acme",
                "version": "1.0",
                "token": TOKENS["runtime"],
            },
        ],
    }


def gateway_config(port: int, control_url: str, shop_url: str) -> dict[str, Any]:
    """The gateway (and the executor, which reads the same file): leases required, intents on."""
    return {
        "gateway": {"development": True, "port": port},
        "control": {"url": control_url, "token": TOKENS["gateway"], "staleness_s": 5.0},
        "leases": {"keys": [LEASE_KEY]},
        "intents": {"enabled": True},
        "executor": {"token": TOKENS["executor"], "poll_s": 0.05, "retry_s": 0.1},
        "identities": [
            {
                "agent": AGENT,
                "tenant": "acme",
                "version": "1.0",
                "token": TOKENS["agent"],
                "lease": "required",
            }
        ],
        "upstreams": [{"name": "shop", "url": f"{shop_url}/mcp"}],
    }


# -- the processes -----------------------------------------------------------------------------


class Stack:
    """The control plane, the shop, the gateway and the executor, each its own process."""

    def __init__(self, directory: Path) -> None:
        self.processes = Processes(directory)
        self.directory = directory
        self.control_url = f"http://127.0.0.1:{free_port()}"
        #: The gateway's and the executor's listener.
        self.enforcement_url = f"http://127.0.0.1:{free_port()}"
        self.shop_url = f"http://127.0.0.1:{free_port()}"
        self.gateway_url = f"http://127.0.0.1:{free_port()}"

    @staticmethod
    def _port(url: str) -> int:
        return int(url.rsplit(":", 1)[1])

    def start(self) -> None:
        cp_toml, gw_toml = self.directory / "control.toml", self.directory / "gateway.toml"
        control_data = control_config(
            self.directory / "control.db", self._port(self.control_url), self._port(self.enforcement_url)
        )
        cp_toml.write_text(tomli_w.dumps(control_data))
        gw_toml.write_text(
            tomli_w.dumps(gateway_config(self._port(self.gateway_url), self.enforcement_url, self.shop_url))
        )
        spawn = self.processes.spawn
        ledger = str(self.directory / "ledger.db")
        shop = spawn(
            "shop", "-m", "haltwire.demo.shop", "--port", str(self._port(self.shop_url)), "--ledger", ledger
        )
        control = spawn("control plane", "-m", "haltwire", "control", "--config", str(cp_toml))
        shop.wait_http(f"{self.shop_url}/ledger")
        control.wait_http(f"{self.control_url}/healthz")
        control.wait_http(f"{self.enforcement_url}/healthz")
        gateway = spawn("gateway", "-m", "haltwire", "gateway", "--config", str(gw_toml))
        executor = spawn("executor", "-m", "haltwire", "executor", "--config", str(gw_toml))
        gateway.wait_http(f"{self.gateway_url}/readyz")
        executor.wait_log("committing intents")


@contextmanager
def running_stack() -> Iterator[Stack]:
    """The stack in a temporary directory, torn down however the block ends (Ctrl-C too)."""
    with tempfile.TemporaryDirectory(prefix="haltwire-refunds-") as tmp:
        stack = Stack(Path(tmp))
        try:
            stack.start()
            yield stack
        finally:
            stack.processes.close()
