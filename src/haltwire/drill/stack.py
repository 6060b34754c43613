"""The drill's own stack on the embedded default: the control plane (SQLite in a temporary
directory), the canary upstream and a gateway following the control plane, each its own process;
and the parts some rungs need (``drill.parts``): the canary targets, ``haltwire egress``,
``haltwire executor``.

In this order, ``running_stack()``:

1. writes the control plane's config: agent class ``canary`` (a short lease, its
   ``time_to_stop_s``), the broker (a generated key), the drill's operator, the gateway's and
   the executor's identities and the canary runtime's (agent ``canary``, tenant ``drill``);
2. writes the gateway's config: leases required of the canary, the canary upstream, the canary
   provider (``[[models]]``, with the targets), ``[control]`` on the enforcement listener and
   ``[executor]``. To show a broken rung, ``broken``: ``gateway-without-control`` writes neither
   ``[control]`` nor ``[leases]`` (a gateway that cannot stop anyone; no intents, no executor),
   and ``no-gateway`` sends the canaries to the canary upstream and provider directly
   (``mcp_url``, ``model_url``);
3. starts the control plane in a process group of its own (its agents' listener is a child
   process), the canary upstream, the targets and the proxy; once the canary answers, the
   gateway and the executor (each waits for the control plane itself, up to ``CONNECT_S``);
   then waits for each;
4. on leaving, resumes the control plane if it is paused and ends every process; the temporary
   directory goes with them: a drill leaves no data behind.

``pause_control()`` and ``resume_control()`` make the control plane unreachable and back
(SIGSTOP and SIGCONT to its process group), for the fail-closed rung.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Protocol

import tomli_w

from haltwire.demo.processes import Processes, Service, free_ports
from haltwire.drill import parts

#: The drill's agent class: a 3-second lease, and its target (at least one lease period).
AGENT_CLASS: Final = "canary"
CLASS_TIMING: Final = {"ttl_s": 3.0, "renew_every_s": 1.0, "renew_timeout_s": 2.5, "time_to_stop_s": 4.0}
#: How long the gateway serves without hearing from the control plane.
STALENESS_S: Final = 2.0
#: How long a process that follows the control plane waits for it at start (it starts beside it).
CONNECT_S: Final = 60.0
AGENT: Final = "canary"
TENANT: Final = "drill"
VERSION: Final = "1.0"
TOKENS: Final = {
    "operator": "tok-drill-operator",
    "gateway": "tok-drill-gateway",
    "runtime": "tok-drill-runtime",
    "agent": "tok-drill-agent",
    "executor": "tok-drill-executor",
}
LEASE_KEY: Final = {"kid": "drill", "secret": "drill-lease-key-never-in-production-0123456789"}


def control_config(db: Path, port: int, admin_port: int, enforcement_port: int) -> dict[str, Any]:
    return {
        "control": {
            "development": True,
            "port": port,
            "admin_port": admin_port,
            "enforcement_port": enforcement_port,
            "heartbeat_s": 0.5,
        },
        "registry": {"backend": "sqlite", "path": str(db)},
        "leases": {"signing_key": LEASE_KEY["kid"], "keys": [LEASE_KEY]},
        "agent_classes": {"default": {}, AGENT_CLASS: dict(CLASS_TIMING)},
        "broker": parts.broker_section(),
        "identities": [
            {"name": "drill-executor", "role": "executor", "token": TOKENS["executor"]},
            {"name": "drill-operator", "role": "operator", "token": TOKENS["operator"], "drill": True},
            {"name": "drill-gateway", "role": "gateway", "token": TOKENS["gateway"]},
            {"name": "drill-canary-runtime", "role": "agent", "agent": AGENT, "tenant": TENANT,
             "version": VERSION, "token": TOKENS["runtime"], "drill": True},
        ],
    }  # fmt: skip


def gateway_config(
    port: int, enforcement_url: str, canary_url: str, broken: bool, targets_url: str | None = None
) -> dict[str, Any]:
    identity: dict[str, Any] = {
        "agent": AGENT,
        "tenant": TENANT,
        "version": VERSION,
        "token": TOKENS["agent"],
    }
    data: dict[str, Any] = {
        "gateway": {"development": True, "port": port},
        "identities": [identity],
        "upstreams": [{"name": "canary", "url": f"{canary_url}/mcp"}],
    }
    if targets_url is not None:
        data["models"] = parts.models_section(targets_url)
    if not broken:
        identity["lease"] = "required"
        data["control"] = {
            "url": enforcement_url,
            "token": TOKENS["gateway"],
            "staleness_s": STALENESS_S,
            "connect_timeout_s": CONNECT_S,
        }
        data["leases"] = {"keys": [LEASE_KEY]}
        data["executor"] = parts.executor_section(TOKENS["executor"])
    return data


class Stack:
    """The processes and their URLs; ``start()`` brings them up, ``processes.close()`` down."""

    def __init__(
        self, directory: Path, *, broken: str | None = None, parts: frozenset[str] = frozenset()
    ) -> None:
        self.directory = directory
        self.broken = broken
        #: The parts some rungs need (``drill.parts``): ``targets``, ``egress``, ``executor``.
        self.parts = parts
        self.processes = Processes(directory)
        urls = [f"http://127.0.0.1:{port}" for port in free_ports(7)]
        self.control_url, self.admin_url, self.enforcement_url, self.canary_url = urls[:4]
        self.gateway_url, self.targets_url, self.egress_url = urls[4:]
        self.control: Service | None = None
        self.paused = False
        self.tokens: dict[str, str] = dict(TOKENS)

    @staticmethod
    def _port(url: str) -> int:
        return int(url.rsplit(":", 1)[1])

    @property
    def mcp_url(self) -> str:
        """Where the canaries call their tool: the gateway (the canary upstream: ``no-gateway``)."""
        return f"{self.canary_url if self.broken == 'no-gateway' else self.gateway_url}/mcp"

    @property
    def model_url(self) -> str:
        """Where the model canary calls ``/v1/chat/completions``: the gateway (the provider: ``no-gateway``)."""
        return f"{self.targets_url if self.broken == 'no-gateway' else self.gateway_url}/v1"

    def start(self) -> None:
        cp_toml, gw_toml = self.directory / "control.toml", self.directory / "gateway.toml"
        ports = (self._port(self.control_url), self._port(self.admin_url), self._port(self.enforcement_url))
        cp_toml.write_text(tomli_w.dumps(control_config(self.directory / "control.db", *ports)))
        gateway = gateway_config(
            self._port(self.gateway_url),
            self.enforcement_url,
            self.canary_url,
            self.broken == "gateway-without-control",
            self.targets_url if "targets" in self.parts else None,
        )
        gw_toml.write_text(tomli_w.dumps(gateway))
        self.control = self._spawn_group(
            "control plane", "-m", "haltwire", "control", "--config", str(cp_toml)
        )
        canary = self.processes.spawn(
            "canary upstream", "-m", "haltwire.drill.canary", "--port", str(self._port(self.canary_url))
        )
        waits = self._start_early()
        # Those that follow the control plane wait for it themselves (``connect_timeout_s``):
        # started while it starts, not after. The gateway and the executor need the canary.
        canary.wait_http(f"{self.canary_url}/record")
        # The gateway's key for the canary provider (the provider does not check it).
        os.environ.setdefault(parts.MODEL_KEY_ENV, "drill-model-key")
        gw = self.processes.spawn("gateway", "-m", "haltwire", "gateway", "--config", str(gw_toml))
        waits += self._start_parts(gw_toml)
        for url in (self.control_url, self.admin_url, self.enforcement_url):
            self.control.wait_http(f"{url}/healthz")
        gw.wait_http(f"{self.gateway_url}/readyz")
        for wait in waits:
            wait()

    def _start_early(self) -> list[Callable[[], None]]:
        """Spawn the parts that need nothing but the control plane; the waits for each."""
        waits: list[Callable[[], None]] = []
        if "targets" in self.parts:
            targets = self.processes.spawn(
                "canary targets", "-m", "haltwire.drill.targets", "--port", str(self._port(self.targets_url)),
                "--control", self.enforcement_url, "--jwks", f"{self.control_url}/.well-known/jwks.json",
                "--token", TOKENS["gateway"], "--staleness", str(STALENESS_S),
            )  # fmt: skip
            waits.append(lambda: targets.wait_http(f"{self.targets_url}/record"))
        if "egress" in self.parts:
            eg_toml = self.directory / "egress.toml"
            config = parts.egress_config(
                self._port(self.egress_url), self.enforcement_url, TOKENS["gateway"], LEASE_KEY,
                STALENESS_S, CONNECT_S, self._port(self.targets_url), AGENT,
            )  # fmt: skip
            eg_toml.write_text(tomli_w.dumps(config))
            egress = self.processes.spawn("egress", "-m", "haltwire", "egress", "--config", str(eg_toml))
            waits.append(lambda: egress.wait_log("haltwire egress "))
        return waits

    def _start_parts(self, gw_toml: Path) -> list[Callable[[], None]]:
        """Spawn the executor (it needs the canary upstream); the wait for it."""
        waits: list[Callable[[], None]] = []
        if "executor" in self.parts and self.broken != "gateway-without-control":
            ex = self.processes.spawn("executor", "-m", "haltwire", "executor", "--config", str(gw_toml))
            waits.append(lambda: ex.wait_log("committing intents through"))
        return waits

    def _spawn_group(self, name: str, *args: str) -> Service:
        """As ``Processes.spawn``, in a process group of its own (its children with it)."""
        log = self.directory / f"{name.replace(' ', '-')}.stderr"
        with log.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        service = Service(name, process, log)
        self.processes.services.append(service)
        return service

    def _signal_control(self, sig: signal.Signals) -> None:
        if self.control is not None and self.control.process.poll() is None:
            os.killpg(self.control.process.pid, sig)

    def pause_control(self) -> None:
        """The control plane stops answering (its connections stay open, unanswered)."""
        self._signal_control(signal.SIGSTOP)
        self.paused = True

    def resume_control(self) -> None:
        if self.paused:
            self._signal_control(signal.SIGCONT)
            self.paused = False

    def close(self) -> None:
        self.resume_control()
        self.processes.close()


class Target(Protocol):
    """What the rungs drill: this module's ``Stack``, or a running one (``drill.remote``)."""

    control_url: str
    admin_url: str
    gateway_url: str
    canary_url: str
    #: The ladder's canary targets (empty on a running stack, which skips the ladder's rungs).
    targets_url: str
    #: ``operator``, ``runtime`` (the agents' listener), ``agent`` (the gateway).
    tokens: dict[str, str]

    @property
    def mcp_url(self) -> str: ...

    def pause_control(self) -> None: ...

    def resume_control(self) -> None: ...


@contextmanager
def running_stack(*, broken: str | None = None, parts: frozenset[str] = frozenset()) -> Iterator[Stack]:
    """The stack in a temporary directory, torn down however the block ends (Ctrl-C too)."""
    with tempfile.TemporaryDirectory(prefix="haltwire-drill-") as tmp:
        stack = Stack(Path(tmp), broken=broken, parts=parts)
        try:
            stack.start()
            yield stack
        finally:
            stack.close()
