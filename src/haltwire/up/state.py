"""The state folder of ``haltwire up``: its secrets, its ports and the configs it writes.

Secrets are generated once, each in a file of its own under ``secrets/`` (mode 0600, the folder
0700), and read back on every later run; the configs name none of them: the identities' tokens
as their SHA-256, the lease key and the gateway's and executor's tokens as environment variables
(``ENV``) the processes are started with. The configs are written afresh on every run, so a
changed ``--port-base`` takes effect.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tomli_w

from haltwire.identity import token_sha256
from haltwire.serve import CannotListen, listen

#: The default state folder, relative to the working directory.
DEFAULT_DIR: Final = ".haltwire"
#: The default ports: the control plane's agents', operators' and enforcement listeners, the
#: gateway and the demo upstream. ``--port-base B`` moves them all by ``B - 8700``.
PORTS: Final = {"control": 8700, "admin": 8701, "enforcement": 8702, "gateway": 8800, "upstream": 8900}
PORT_BASE: Final = PORTS["control"]
#: Which part listens on each port, in messages.
LISTENERS: Final = {
    "control": "the control plane's agents' listener",
    "admin": "the control plane's operators' listener",
    "enforcement": "the control plane's enforcement listener",
    "gateway": "the gateway",
    "upstream": "the demo upstream",
}
#: The secrets, by file name: what each is, in the list printed when they are made.
SECRETS: Final = {
    "operator.token": "operator token (stop, clear, approve)",
    "viewer.token": "viewer token (read only)",
    "agent.token": "agent token (the gateway and the control plane's agents' listener)",
    "gateway.token": "the gateway's token at the control plane",
    "executor.token": "the executor's token at the control plane",
    "lease.key": "the lease signing key",
}
#: The environment variables the processes read their secrets from.
ENV: Final = {
    "lease.key": "HALTWIRE_UP_LEASE_KEY",
    "gateway.token": "HALTWIRE_UP_GATEWAY_TOKEN",
    "executor.token": "HALTWIRE_UP_EXECUTOR_TOKEN",
}
#: The demo agent's identity, at the gateway and the control plane.
AGENT: Final = {"agent": "demo-agent", "tenant": "demo", "version": "1.0"}
LEASE_KID: Final = "up"


class StateError(Exception):
    """The state folder cannot be used (one sentence, naming the path)."""


@dataclass(frozen=True, slots=True)
class Ports:
    control: int
    admin: int
    enforcement: int
    gateway: int
    upstream: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        shift = base - PORT_BASE
        ports = {name: port + shift for name, port in PORTS.items()}
        if not all(0 < p < 65536 for p in ports.values()):
            raise StateError(f"--port-base {base} puts a port outside 1-65535 (it uses base to base + 200)")
        return cls(**ports)

    def taken(self, host: str = "127.0.0.1") -> str | None:
        """The first port another process holds, as a sentence, or None when all are free."""
        for name in PORTS:
            port = getattr(self, name)
            try:
                listen(host, port).close()  # as the process will bind it
            except CannotListen:
                return f"port {port} ({LISTENERS[name]}) is taken by another process"
        return None


@dataclass(frozen=True, slots=True)
class Secrets:
    values: dict[str, str]
    folder: Path
    #: The file names made by this run (printed once); the others were read back.
    made: tuple[str, ...]

    def path(self, name: str) -> Path:
        return self.folder / name

    def env(self) -> dict[str, str]:
        return {var: self.values[name] for name, var in ENV.items()}


def prepare(directory: Path) -> Path:
    """The state folder, made (0700) if missing; ``StateError`` when it cannot be."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / "logs").mkdir(mode=0o700, exist_ok=True)
        (directory / "secrets").mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory / "secrets", 0o700)
    except OSError as exc:
        raise StateError(f"cannot use {directory} as the state folder: {exc.strerror or exc}") from None
    return directory.resolve()


def load_secrets(directory: Path) -> Secrets:
    """Every secret: read from its file, or generated and written there (0600) when missing."""
    folder = directory / "secrets"
    values, made = {}, []
    for name in SECRETS:
        path = folder / name
        try:
            values[name] = path.read_text().strip()
        except FileNotFoundError:
            values[name] = _write_secret(path, _generate(name))
            made.append(name)
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(values[name]) < 32:
            raise StateError(f"{path} holds no usable secret (under 32 characters): remove it to make another")
    return Secrets(values, folder, tuple(made))


def _generate(name: str) -> str:
    prefix = name.split(".")[0]
    return f"hw-{prefix}-{secrets.token_urlsafe(32)}"


def _write_secret(path: Path, value: str) -> str:
    """Write ``value`` whole to a new 0600 file (never a half-written secret at ``path``)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(value + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise StateError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return value


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def control_config(directory: Path, ports: Ports, s: Secrets) -> dict[str, Any]:
    """The control plane: SQLite in the state folder, every role an identity, the lease key."""
    v = s.values
    roles = [("operator", "operator", "operator.token"), ("viewer", "viewer", "viewer.token"),
             ("gateway-1", "gateway", "gateway.token"), ("executor-1", "executor", "executor.token")]
    return {
        "control": {"port": ports.control, "admin_port": ports.admin, "enforcement_port": ports.enforcement},
        "registry": {"backend": "sqlite", "path": str(directory / "control.db")},
        "leases": {"signing_key": LEASE_KID, "keys": [{"kid": LEASE_KID, "secret_env": ENV["lease.key"]}]},
        "identities": [
            *({"name": name, "role": role, "token_sha256": token_sha256(v[file])} for name, role, file in roles),
            {"name": "demo-agent-runtime", "role": "agent", **AGENT, "token_sha256": token_sha256(v["agent.token"])},
        ],
    }  # fmt: skip


def gateway_config(ports: Ports, s: Secrets) -> dict[str, Any]:
    """The gateway (and the executor, which reads the same file): the demo upstream behind it,
    the control plane's stops, leases optional for the demo agent, intents on."""
    return {
        "gateway": {"host": "127.0.0.1", "port": ports.gateway},
        "control": {"url": url(ports.enforcement), "token_env": ENV["gateway.token"]},
        "leases": {"keys": [{"kid": LEASE_KID, "secret_env": ENV["lease.key"]}]},
        "intents": {"enabled": True},
        "executor": {"token_env": ENV["executor.token"]},
        "identities": [{**AGENT, "token_sha256": token_sha256(s.values["agent.token"]), "lease": "optional"}],
        "upstreams": [{"name": "demo", "url": f"{url(ports.upstream)}/mcp"}],
    }


def write_configs(directory: Path, ports: Ports, s: Secrets) -> tuple[Path, Path]:
    """``control.toml`` and ``gateway.toml`` in the state folder (no secret in either)."""
    control, gateway = directory / "control.toml", directory / "gateway.toml"
    try:
        control.write_text(tomli_w.dumps(control_config(directory, ports, s)))
        gateway.write_text(tomli_w.dumps(gateway_config(ports, s)))
    except OSError as exc:
        raise StateError(f"cannot write the configs in {directory}: {exc.strerror or exc}") from None
    return control, gateway
