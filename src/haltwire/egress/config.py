"""The egress proxy's TOML configuration (``haltwire egress --config``), validated up front.

``[egress]`` (where it listens, its bounds, its profiles and which agent gets which),
``[control]`` (the control plane whose stops it follows: required, a proxy that cannot hear
stops cannot enforce them) and ``[leases]`` (the keys it verifies lease tokens with: required,
the lease token is how it knows a connection's run) and ``[broker]`` (optional: the broker
whose run credentials it accepts as well). ``docs/egress.md`` describes every key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from haltwire.config import (
    BrokerLink,
    ConfigModel,
    ControlLink,
    LeaseKeysSection,
    read_toml,
    validate_config,
)
from haltwire.egress.profiles import NONE, NOTHING, Profile


class EgressSection(ConfigModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8899, ge=0, le=65535)
    #: Accept plain secrets (``[control] token``, ``[leases] secret``). Never in production.
    development: bool = False
    #: Open client connections at once; past it a new one is closed as it is accepted.
    max_connections: int = Field(default=1024, ge=1)
    #: A request head must arrive whole within this long of the connection's opening (slowloris).
    header_timeout_s: float = Field(default=5.0, gt=0)
    #: The largest request head accepted (request line and headers); past it: closed with 431.
    max_head_bytes: int = Field(default=16_384, ge=1024, le=1_048_576)
    #: Resolving a target's name and connecting to it, together.
    connect_timeout_s: float = Field(default=10.0, gt=0)
    #: A plain HTTP request with no bytes either way for this long is closed (tunnels are not
    #: bounded: a tunnel idles legitimately, and stops and lease expiry close it).
    idle_timeout_s: float = Field(default=60.0, gt=0)
    #: How often the proxy looks at whether its watch has gone stale (it then closes everything).
    stale_check_s: float = Field(default=0.1, gt=0, le=1.0)
    #: Profile name -> allow entries (``haltwire.egress.profiles``). ``none`` is built in.
    profiles: dict[str, list[str]] = Field(default_factory=dict)
    #: Agent id (the lease's ``agent`` claim) -> profile name.
    agents: dict[str, str] = Field(default_factory=dict)
    #: The profile of an agent not in ``agents``.
    default_profile: str = NONE
    #: Serve ``/metrics`` on this port (of ``metrics_host``); unset: no metrics listener.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _profiles(self) -> EgressSection:
        for name, entries in self.profiles.items():
            try:
                Profile.parse(name, entries)  # a bad entry fails here, named
            except ValueError as exc:
                raise ValueError(f"profiles.{name}: {exc}") from None
        known = set(self.profiles) | {NONE}
        for agent, profile in self.agents.items():
            if profile not in known:
                raise ValueError(f"agents.{agent}: no profile is named {profile!r}")
        if self.default_profile not in known:
            raise ValueError(f"default_profile: no profile is named {self.default_profile!r}")
        return self

    def built_profiles(self) -> dict[str, Profile]:
        out = {name: Profile.parse(name, entries) for name, entries in self.profiles.items()}
        out[NONE] = NOTHING
        return out


class EgressBroker(BrokerLink):
    """``[broker]``: the control plane's run credentials are proxy credentials too."""

    audience: str = Field(default="haltwire-egress", min_length=1)


class EgressConfig(ConfigModel):
    egress: EgressSection = Field(default_factory=EgressSection)
    control: ControlLink
    leases: LeaseKeysSection
    broker: EgressBroker | None = None

    @model_validator(mode="after")
    def _consistent(self) -> EgressConfig:
        if self.control.token is not None and not self.egress.development:
            raise ValueError(
                "control: plain 'token' is accepted only with egress.development = true; use token_env"
            )
        if self.leases.signing_key is not None:
            raise ValueError("leases.signing_key: the egress proxy only verifies lease tokens; remove it")
        if self.leases.plain_secrets() and not self.egress.development:
            raise ValueError(
                "leases.keys: plain 'secret' is accepted only with egress.development = true; use secret_env"
            )
        return self


class Profiles:
    """Which profile an agent's runs get (``[egress] agents``, else ``default_profile``)."""

    def __init__(self, section: EgressSection) -> None:
        self._profiles = section.built_profiles()
        self._agents = dict(section.agents)
        self._default = section.default_profile

    def for_agent(self, agent: str) -> Profile:
        return self._profiles[self._agents.get(agent, self._default)]


def parse_config(data: dict[str, Any], source: str = "<config>") -> EgressConfig:
    return validate_config(EgressConfig, data, source)


def load_config(path: str | Path) -> EgressConfig:
    p = Path(path)
    return parse_config(read_toml(p), str(p))
