"""The control plane's TOML configuration, validated up front like the gateway's.

A bad config is a start-up error phrased ``FILE: KEY: PROBLEM`` (``ConfigError``; the CLI
exits 2). Identities carry a role; tokens are kept as SHA-256 hashes (plain ``token`` only
with ``control.development = true``). A relative SQLite path is relative to the config file.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from haltwire.config import ConfigModel, LeaseKeysSection, TokenFields, read_toml, validate_config
from haltwire.control.agent_classes import AgentClass as AgentClass
from haltwire.control.agent_classes import RuleMode as RuleMode
from haltwire.control.receivers import NotifyTarget, check_receivers
from haltwire.identity import token_sha256
from haltwire.limits import MAX_BODY_BYTES, MAX_INTENT_BODY_BYTES, MIN_BODY_BYTES
from haltwire.listener import ListenerLimits

Role = Literal["operator", "tripwire", "gateway", "executor", "agent", "viewer"]


class ControlSection(ConfigModel):
    """``[control]``: three listeners, so that nothing an agent fleet does to one delays a stop.

    ``host``/``port`` is for agents (runs, leases, their watch; gateways and executors are
    served there too); ``admin_host``/``admin_port`` is for operators, tripwires and viewers, and
    ``enforcement_host``/``enforcement_port`` for gateways and executors; each of those two
    refuses every other role. Each has its own limits (``haltwire.listener``), and ``haltwire
    control`` serves the agents' listener in a process of its own (``haltwire.control_processes``).
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    #: Default: ``host``.
    admin_host: str | None = None
    #: Default: the next port after ``port`` (8701), or any free port when ``port`` is 0.
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    #: Default: ``host``.
    enforcement_host: str | None = None
    #: Default: two after ``port`` (8702), or any free port when ``port`` is 0.
    enforcement_port: int | None = Field(default=None, ge=0, le=65535)
    agent_listener: ListenerLimits = Field(default_factory=lambda: ListenerLimits(max_connections=768))
    admin_listener: ListenerLimits = Field(
        default_factory=lambda: ListenerLimits(max_connections=64, max_in_flight=32)
    )
    enforcement_listener: ListenerLimits = Field(
        default_factory=lambda: ListenerLimits(max_connections=256, max_in_flight=64)
    )
    #: Accept plain ``token`` entries. Never in production.
    development: bool = False
    #: Seconds between heartbeats on an idle watch stream.
    heartbeat_s: float = Field(default=5.0, gt=0)
    #: The largest request body of any endpoint (413 past it; ``haltwire.limits`` says why).
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, ge=MIN_BODY_BYTES)
    #: ... of recording an intent and committing one: a tool call's arguments, a tool's result.
    max_intent_body_bytes: int = Field(default=MAX_INTENT_BODY_BYTES, ge=MIN_BODY_BYTES)

    @model_validator(mode="after")
    def _consistent(self) -> ControlSection:
        if self.port == self.admin_port != 0 and self.host == (self.admin_host or self.host):
            raise ValueError(f"admin_port: the admin listener needs a port of its own, not {self.port}")
        enforcement = (self.enforcement_host or self.host, self.enforcement_port)
        for name, taken in (
            ("port", (self.host, self.port)),
            ("admin_port", (self.admin_host or self.host, self.admin_port)),
        ):
            if enforcement == taken and self.enforcement_port:
                raise ValueError(
                    f"enforcement_port: the enforcement listener needs a port of its own, not {name}'s {taken[1]}"
                )
        if self.max_intent_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_intent_body_bytes: at least max_body_bytes ({self.max_body_bytes}), "
                f"not {self.max_intent_body_bytes}"
            )
        return self

    def admin_port_for(self, port: int) -> int:
        """The admin listener's port when the agents' listener is on ``port``."""
        if self.admin_port is not None:
            return self.admin_port
        return 0 if port == 0 else port + 1

    def enforcement_port_for(self, port: int) -> int:
        """The enforcement listener's port when the agents' listener is on ``port``."""
        if self.enforcement_port is not None:
            return self.enforcement_port
        return 0 if port == 0 else port + 2


class RegistrySection(ConfigModel):
    backend: Literal["sqlite", "postgres"] = "sqlite"
    #: SQLite file holding the registry and the audit log.
    path: Path = Path("haltwire.db")
    url: str = "postgresql://postgres@127.0.0.1:5432/test"
    schema_: str = Field(default="haltwire", alias="schema", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


#: The shortest audit key accepted: 32 characters (``openssl rand -hex 32`` gives 64).
MIN_AUDIT_KEY: Final = 32


class AuditSection(ConfigModel):
    """``[audit]``: the secret the audit log's hash chain is keyed with (HMAC-SHA256).

    Kept out of the database, so that someone who can edit it cannot rewrite a record and
    recompute the chain. From an environment variable (``key_env``), a file (``key_file``,
    relative to the config file), or in plain text (``key``, development only). Without any:
    with SQLite, the file beside the database (``<path>.audit-key``, made on first start);
    with PostgreSQL, one is required, the same for every replica (in development, a key
    derived from the database's URL and schema: no secret at all).
    """

    key_env: str | None = None
    key_file: Path | None = None
    key: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> AuditSection:
        if sum(x is not None for x in (self.key_env, self.key_file, self.key)) > 1:
            raise ValueError("give at most one of key_env, key_file or key")
        if self.key is not None and len(self.key) < MIN_AUDIT_KEY:
            raise ValueError(f"key: at least {MIN_AUDIT_KEY} characters")
        return self


class BrokerKeyConfig(ConfigModel):
    """One credential-signing key (``[[broker.keys]]``): an Ed25519 private key in PEM.

    From an environment variable (``private_key_env``) or a file (``private_key_file``,
    relative to the config file). Every key's public half is published in the JWKS.
    """

    kid: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    private_key_env: str | None = None
    private_key_file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> BrokerKeyConfig:
        if (self.private_key_env is None) == (self.private_key_file is None):
            raise ValueError("give exactly one of private_key_env or private_key_file")
        return self


class WallClockSection(ConfigModel):
    """``[wall_clock]``: how often the control plane looks for runs past their agent class's
    ``max_wall_clock_s`` (the bound itself is per class)."""

    #: The granularity: a run is stopped at most this long after its bound has passed.
    check_every_s: float = Field(default=1.0, gt=0, le=60)


#: Names the control plane's own rules write stops as: no identity may take one.
RULE_CALLERS: Final = frozenset({"intent-limit", "wall-clock", "escalation"})


class Escalation(ConfigModel):
    """``[[escalations]]``: tripwire stops of runs, counted in a window, stop a wider scope.

    A trip is a ``run:`` stop issued by a caller of role ``tripwire`` (the gateway's tripwires,
    ``intent-limit``, ``wall-clock``), of a registered run, not cleared. When ``count`` of them
    (distinct runs, or distinct tenants: ``counts``) fall within ``window_s`` in one group of
    ``to`` (the runs' tenant, agent version, agent, or all of them for ``global``), the rule
    stops that scope (``haltwire.control.escalation``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: Names the rule in the stop's reason and the audit log; default ``run-to-TO``.
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    #: What is counted: stops of runs (the only source so far).
    from_: Literal["run"] = Field(default="run", alias="from")
    #: What is stopped. ``global`` only when a rule says so: nothing escalates to it by default.
    to: Literal["tenant", "version", "agent", "global"]
    count: int = Field(ge=1, le=1000)
    window_s: float = Field(gt=0, le=7 * 86400)
    #: ``runs`` (default for ``to = "tenant"``) or ``tenants`` (default for the others).
    counts: Literal["runs", "tenants"] | None = None
    mode: RuleMode = "enforce"

    @model_validator(mode="after")
    def _consistent(self) -> Escalation:
        if self.to == "tenant" and self.counts == "tenants":
            raise ValueError('counts: "tenants" counts one tenant at most for to = "tenant"; use "runs"')
        return self

    @property
    def rule(self) -> str:
        return self.name or f"run-to-{self.to}"

    @property
    def unit(self) -> Literal["runs", "tenants"]:
        return self.counts or ("runs" if self.to == "tenant" else "tenants")


class IntentLimit(ConfigModel):
    """``[[intent_limits]]``: at most ``per_run`` intents of ``tool`` pass the executor's final
    check in one run; the next one writes a stop for the run (as ``intent-limit``) and is
    cancelled. A simple counting rule for irreversible tools (the refund incident's tripwire)."""

    tool: str = Field(min_length=1)
    per_run: int = Field(ge=1)


class BrokerSection(ConfigModel):
    """``[broker]``: run-scoped credentials for downstream systems (stop level 4).

    ``ttl_s`` is 300 to 900 seconds (5 to 15 minutes); with ``control.development = true``
    anything above 0 up to 900 is accepted, for demos and tests. ``generate = true``
    (development only) makes an ephemeral signing key at start instead of ``keys``.
    """

    ttl_s: float = Field(default=600.0, gt=0, le=900)
    #: The downstream systems a credential may be issued for (its ``aud`` claim).
    audiences: list[str] = Field(min_length=1)
    keys: list[BrokerKeyConfig] = Field(default_factory=list)
    #: The key id new credentials are signed with.
    signing_key: str | None = None
    generate: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> BrokerSection:
        kids = [k.kid for k in self.keys]
        if len(set(kids)) != len(kids):
            raise ValueError("keys: key ids must be unique")
        if any(not a.strip() for a in self.audiences):
            raise ValueError("audiences: an audience must not be empty")
        if self.generate:
            if self.keys or self.signing_key is not None:
                raise ValueError("generate = true makes its own key; remove keys and signing_key")
        elif not self.keys:
            raise ValueError("keys: give at least one key (or generate = true in development)")
        elif self.signing_key is None:
            raise ValueError("signing_key: name the key new credentials are signed with")
        elif self.signing_key not in kids:
            raise ValueError(f"signing_key {self.signing_key!r} is not among the keys")
        return self


class IdentityEntry(TokenFields):
    name: str = Field(min_length=1)
    role: Role
    #: For role ``agent``: the agent id whose stops it may read and whose runs it registers.
    agent: str | None = None
    #: For role ``agent``: the tenant and agent version its runs carry (as in the gateway).
    tenant: str = "default"
    version: str = "0"
    #: When the token stops being accepted (a TOML datetime with its UTC offset).
    expires: datetime | None = None
    #: A drill's identity (``haltwire drill``): what it writes is drill data, and so is every run
    #: of its tenant when it is an agent (``haltwire.control.drills``).
    drill: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> IdentityEntry:
        if self.expires is not None and self.expires.tzinfo is None:
            raise ValueError("expires needs a UTC offset, e.g. 2027-01-31T00:00:00Z")
        if self.role == "agent" and not self.agent:
            raise ValueError("an identity with role 'agent' needs agent (its agent id)")
        if self.role != "agent" and self.agent is not None:
            raise ValueError("agent is only for identities with role 'agent'")
        return self


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from, resolved from its bearer token."""

    name: str
    role: Role
    agent: str | None = None
    tenant: str = "default"
    version: str = "0"
    #: Unix time after which the token is refused as expired.
    expires_at: float | None = None
    #: A drill's identity: its writes are drill data (``haltwire.control.drills``).
    drill: bool = False

    @property
    def runs_as(self) -> str | None:
        """The agent id of the runs this caller registers: its agent, or an executor's own name."""
        if self.role == "executor":
            return self.name
        return self.agent if self.role == "agent" else None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class DashboardSection(ConfigModel):
    """``[dashboard]``: the operators' web pages on the admin listener (``/dashboard/``)."""

    #: How long a sign-in lasts (never past the token's own ``expires``).
    session_s: float = Field(default=12 * 3600, gt=0)


class ControlConfig(ConfigModel):
    control: ControlSection = Field(default_factory=ControlSection)
    registry: RegistrySection = Field(default_factory=RegistrySection)
    #: Lease-token keys; without them the control plane grants no leases.
    leases: LeaseKeysSection | None = None
    #: Lease timing per agent class; a ``default`` class is always there.
    agent_classes: dict[str, AgentClass] = Field(default_factory=lambda: {"default": AgentClass()})
    identities: list[IdentityEntry] = Field(default_factory=list)
    #: The credential broker; without it the credential endpoints answer 501.
    broker: BrokerSection | None = None
    intent_limits: list[IntentLimit] = Field(default_factory=list)
    audit: AuditSection = Field(default_factory=AuditSection)
    escalations: list[Escalation] = Field(default_factory=list)
    wall_clock: WallClockSection = Field(default_factory=WallClockSection)
    #: Receivers of pages (``[[notify]]``); none: no page is written.
    notify: list[NotifyTarget] = Field(default_factory=list)
    dashboard: DashboardSection = Field(default_factory=DashboardSection)

    @model_validator(mode="after")
    def _consistent(self) -> ControlConfig:
        names = [i.name for i in self.identities]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"identities: names must be unique, repeated: {', '.join(dupes)}")
        if not self.control.development and any(i.token is not None for i in self.identities):
            raise ValueError(
                "identities: plain 'token' is accepted only with control.development = true; use token_sha256"
            )
        if self.leases is not None:
            if self.leases.signing_key is None:
                raise ValueError("leases.signing_key: the control plane signs lease tokens; name the key")
            if self.leases.plain_secrets() and not self.control.development:
                raise ValueError(
                    "leases.keys: plain 'secret' is accepted only with control.development = true; use secret_env"
                )
        if self.broker is not None and not self.control.development:
            if self.broker.generate:
                raise ValueError("broker.generate: an ephemeral key is for control.development = true only")
            if not 300 <= self.broker.ttl_s <= 900:
                raise ValueError(
                    f"broker.ttl_s ({self.broker.ttl_s:g}) must be 300 to 900 seconds (5 to 15 minutes)"
                )
        if not self.control.development:
            if self.audit.key is not None:
                raise ValueError(
                    "audit.key: a plain key is accepted only with control.development = true; use key_env"
                )
            if (
                self.registry.backend == "postgres"
                and self.audit.key_env is None
                and self.audit.key_file is None
            ):
                raise ValueError(
                    "audit: with PostgreSQL, give key_env (or key_file): every replica keys the audit "
                    "log's chain with the same secret, kept out of the database"
                )
        check_receivers(self.notify, self.control.development)
        tools = [limit.tool for limit in self.intent_limits]
        if len(set(tools)) != len(tools):
            raise ValueError("intent_limits: one limit per tool")
        if "default" not in self.agent_classes:
            raise ValueError("agent_classes: a 'default' class is needed")
        # An executor's runs carry its name as agent: an agent of its tenant by that id would own them.
        executors = {(i.name, i.tenant) for i in self.identities if i.role == "executor"}
        clashes = sorted(
            f"{i.agent} (tenant {i.tenant})" for i in self.identities if (i.agent, i.tenant) in executors
        )
        if clashes:
            raise ValueError(
                f"identities: an agent id is an executor's name in the same tenant: {', '.join(clashes)}; "
                "rename one (an executor's runs carry its name as agent)"
            )
        # A drill tenant's runs are drill data wholesale: no real agent may register runs in it.
        drills = {i.tenant for i in self.identities if i.role == "agent" and i.drill}
        mixed = sorted({f"{i.name} (tenant {i.tenant})" for i in self.identities
                        if i.role == "agent" and not i.drill and i.tenant in drills})  # fmt: skip
        if mixed:
            raise ValueError(f"identities: {', '.join(mixed)} is in a drill tenant; give it drill = true, or another tenant")
        hashes = [i.token_sha256 or token_sha256(i.token or "") for i in self.identities]
        if len(set(hashes)) != len(hashes):
            raise ValueError("identities: two identities share one token")
        return self

    @model_validator(mode="after")
    def _rules(self) -> ControlConfig:
        taken = sorted(RULE_CALLERS.intersection(i.name for i in self.identities))
        if taken:
            raise ValueError(
                f"identities: {', '.join(taken)} is the name a control-plane rule writes stops as; rename the identity"
            )
        rules = [e.rule for e in self.escalations]
        repeated = sorted({r for r in rules if rules.count(r) > 1})
        if repeated:
            raise ValueError(f"escalations: two rules named {', '.join(repeated)}; give each its own name")
        return self

    def intent_limit(self, tool: str) -> int | None:
        return next((limit.per_run for limit in self.intent_limits if limit.tool == tool), None)

    def callers(self) -> dict[str, Caller]:
        """Token SHA-256 to caller."""
        return {
            i.digest: Caller(
                i.name, i.role, i.agent, i.tenant, i.version, i.expires.timestamp() if i.expires else None, i.drill
            )
            for i in self.identities
        }


def parse_control_config(data: dict[str, Any], source: str = "<config>") -> ControlConfig:
    return validate_config(ControlConfig, data, source)


def load_control_config(path: str | Path) -> ControlConfig:
    p = Path(path)
    config = parse_control_config(read_toml(p), str(p))
    if not config.registry.path.is_absolute():
        registry = config.registry.model_copy(update={"path": p.parent / config.registry.path})
        config = config.model_copy(update={"registry": registry})
    if config.broker is not None:  # key files, like the SQLite path, are relative to the config file
        keys = [
            k.model_copy(update={"private_key_file": p.parent / k.private_key_file})
            if k.private_key_file is not None and not k.private_key_file.is_absolute()
            else k
            for k in config.broker.keys
        ]
        config = config.model_copy(update={"broker": config.broker.model_copy(update={"keys": keys})})
    key_file = config.audit.key_file
    if key_file is not None and not key_file.is_absolute():
        config = config.model_copy(
            update={"audit": config.audit.model_copy(update={"key_file": p.parent / key_file})}
        )
    return config
