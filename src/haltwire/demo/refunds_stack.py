"""The stack of ``haltwire demo refunds``: the control plane, the shop, the gateway, the executor
and on-call (a webhook receiver), each its own process on loopback, and the development configs
they read.

The control plane gives agent class ``support`` a 10-second lease, runs the credential broker
and pages on-call for every stop (``[[notify]]``). The gateway requires a lease, records the
shop's irreversible calls as intents, which the executor commits, and runs the seed's tripwires
(``[[tripwires]]``): at most ``PER_TENANT_PER_HOUR`` refunds per tenant per hour, a stop for any
run with more than ``PER_RUN`` refunds, and the built-in content detector in shadow mode on
``read_order`` (the tool that returns the reviews). It writes their stops and shadow firings as
the tripwire identity ``gateway-tripwires`` on the control plane's admin listener, and every call
to its call log (``[call_log]``, ``calls.jsonl``), which the demo replays once the runs are over.

Each run of ``--runs N`` is the support agent of a tenant of its own (``tenant(n)``): the runs
of one tenant would share its hourly rate, and the fifth would be stopped at its first refund.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import tomli_w

from haltwire.demo.processes import Processes, Service, free_ports
from haltwire.demo.support_agent import AUDIENCE

#: The tripwires: at most ``PER_RUN`` refunds a run, ``PER_TENANT_PER_HOUR`` a tenant an hour.
PER_RUN: Final = 5
PER_TENANT_PER_HOUR: Final = 20
#: The gateway's tripwire rules' names, and its tripwire identity at the control plane.
RUN_RULE: Final = "refunds-per-run"
TENANT_RULE: Final = "refunds-per-tenant"
CONTENT_RULE: Final = "injected-review"
TRIPWIRE: Final = "gateway-tripwires"
#: The ``[[notify]]`` receiver standing in for on-call.
PAGER: Final = "oncall-webhook"
#: Plain tokens and the lease key of the demo's development configs.
TOKENS: Final = {
    "operator": "tok-refunds-oncall",
    "gateway": "tok-refunds-gateway",
    "tripwire": "tok-refunds-tripwires",
    "executor": "tok-refunds-executor",
}
LEASE_KEY: Final = {"kid": "demo", "secret": "demo-refunds-lease-key-never-in-production-0123"}
EXECUTOR: Final = "executor-1"
AGENT: Final = "support-bot"


def tenant(number: int) -> str:
    """Run ``number``'s tenant: ``acme`` for the first, one of its own for each other."""
    return "acme" if number == 1 else f"acme-{number}"


def agent_token(number: int) -> str:
    """The support agent's gateway token for run ``number``'s tenant."""
    return f"tok-refunds-support-{number}"


def runtime_token(number: int) -> str:
    """The support agent's runtime token (leases, checkpoints, the broker) for run ``number``'s tenant."""
    return f"tok-refunds-runtime-{number}"


# -- the configs -------------------------------------------------------------------------------


def control_config(
    db: Path, port: int, admin_port: int, enforcement_port: int, oncall_url: str, tenants: int
) -> dict[str, Any]:
    """The control plane: a 10-second lease for ``support``, the broker, on-call paged by webhook."""
    return {
        "control": {
            "development": True,
            "port": port,
            "admin_port": admin_port,
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
        "notify": [
            {"name": PAGER, "kind": "webhook", "url": f"{oncall_url}/page", "report_url_base": f"http://127.0.0.1:{admin_port}"}
        ],
        "identities": [
            {"name": "oncall", "role": "operator", "token": TOKENS["operator"]},
            {"name": "gateway-1", "role": "gateway", "token": TOKENS["gateway"]},
            {"name": TRIPWIRE, "role": "tripwire", "token": TOKENS["tripwire"]},
            {"name": EXECUTOR, "role": "executor", "token": TOKENS["executor"]},
            *(
                {
                    "name": f"support-runtime-{n}",
                    "role": "agent",
                    "agent": AGENT,
                    "tenant": tenant(n),
                    "version": "1.0",
                    "token": runtime_token(n),
                }
                for n in range(1, tenants + 1)
            ),
        ],
    }  # fmt: skip


def tripwires() -> list[dict[str, Any]]:
    """The seed's tripwires, as the gateway's ``[[tripwires]]``."""
    return [
        {"name": TENANT_RULE, "kind": "rate", "tools": ["issue_refund"], "per": "tenant", "scope": "run",
         "limit": PER_TENANT_PER_HOUR, "window_s": 3600},
        {"name": RUN_RULE, "kind": "steps", "tools": ["issue_refund"], "limit": PER_RUN},
        {"name": CONTENT_RULE, "kind": "content", "tools": ["read_order"], "detector": "builtin", "mode": "shadow"},
    ]  # fmt: skip


def gateway_config(
    port: int, control_url: str, admin_url: str, shop_url: str, tenants: int, call_log: Path | None = None
) -> dict[str, Any]:
    """The gateway (and the executor, which reads the same file): leases required, intents on,
    the tripwires, their stops written on the admin listener, every call in ``call_log``."""
    return {
        "gateway": {"development": True, "port": port},
        "control": {"url": control_url, "token": TOKENS["gateway"], "staleness_s": 5.0},
        "leases": {"keys": [LEASE_KEY]},
        "intents": {"enabled": True},
        "executor": {"token": TOKENS["executor"], "poll_s": 0.05, "retry_s": 0.1},
        "tripwire_stops": {"url": admin_url, "token": TOKENS["tripwire"]},
        "tripwires": tripwires(),
        **({"call_log": {"path": str(call_log)}} if call_log else {}),
        "identities": [
            {"agent": AGENT, "tenant": tenant(n), "version": "1.0", "token": agent_token(n), "lease": "required"}
            for n in range(1, tenants + 1)
        ],
        "upstreams": [{"name": "shop", "url": f"{shop_url}/mcp"}],
    }


# -- the processes -----------------------------------------------------------------------------


class Stack:
    """The control plane, the shop, the gateway, the executor and on-call, each its own process;
    identities for ``tenants`` tenants (one a run)."""

    def __init__(self, directory: Path, tenants: int = 1) -> None:
        self.processes = Processes(directory)
        self.directory = directory
        self.tenants = tenants
        urls = iter(f"http://127.0.0.1:{port}" for port in free_ports(6))
        self.control_url = next(urls)
        #: The operators' and tripwires' listener.
        self.admin_url = next(urls)
        self.oncall_url = next(urls)
        #: The gateway's and the executor's listener.
        self.enforcement_url = next(urls)
        self.shop_url = next(urls)
        self.gateway_url = next(urls)
        self.gateway_toml = directory / "gateway.toml"
        self.call_log = directory / "calls.jsonl"
        self.gateway: Service | None = None

    @staticmethod
    def _port(url: str) -> int:
        return int(url.rsplit(":", 1)[1])

    def start(self) -> None:
        cp_toml, gw_toml = self.directory / "control.toml", self.gateway_toml
        control_data = control_config(
            self.directory / "control.db",
            self._port(self.control_url),
            self._port(self.admin_url),
            self._port(self.enforcement_url),
            self.oncall_url,
            self.tenants,
        )
        cp_toml.write_text(tomli_w.dumps(control_data))
        gateway_data = gateway_config(
            self._port(self.gateway_url),
            self.enforcement_url,
            self.admin_url,
            self.shop_url,
            self.tenants,
            self.call_log,
        )
        gw_toml.write_text(tomli_w.dumps(gateway_data))
        spawn = self.processes.spawn
        ledger = str(self.directory / "ledger.db")
        shop = spawn(
            "shop", "-m", "haltwire.demo.shop", "--port", str(self._port(self.shop_url)), "--ledger", ledger
        )
        oncall = spawn("on-call", "-m", "haltwire.demo.oncall", "--port", str(self._port(self.oncall_url)))
        control = spawn("control plane", "-m", "haltwire", "control", "--config", str(cp_toml))
        shop.wait_http(f"{self.shop_url}/ledger")
        oncall.wait_http(f"{self.oncall_url}/pages")
        control.wait_http(f"{self.control_url}/healthz")
        control.wait_http(f"{self.admin_url}/healthz")
        control.wait_http(f"{self.enforcement_url}/healthz")
        self.gateway = spawn("gateway", "-m", "haltwire", "gateway", "--config", str(gw_toml))
        executor = spawn("executor", "-m", "haltwire", "executor", "--config", str(gw_toml))
        self.gateway.wait_http(f"{self.gateway_url}/readyz")
        executor.wait_log("committing intents")

    def stop_gateway(self) -> None:
        """Stop the gateway as an operator would (SIGTERM): it writes its call log's last records."""
        if self.gateway is not None:
            self.processes.stop(self.gateway)


@contextmanager
def running_stack(tenants: int = 1) -> Iterator[Stack]:
    """The stack in a temporary directory, torn down however the block ends (Ctrl-C too)."""
    with tempfile.TemporaryDirectory(prefix="haltwire-refunds-") as tmp:
        stack = Stack(Path(tmp), tenants)
        try:
            stack.start()
            yield stack
        finally:
            stack.processes.close()
