"""The gateway's TOML configuration (``haltwire gateway --config``), validated up front.

The executor reads the same file (``[executor]``, and the same upstreams). The schema is the
pydantic models below; ``docs/configuration.md`` describes every key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator, model_validator

from haltwire.config import (
    BearerToken,
    BrokerLink,
    ConfigError,
    ConfigModel,
    ControlLink,
    Label,
    LeaseKeysSection,
    TokenFields,
    UpstreamConfig,
    read_toml,
    validate_config,
)
from haltwire.credentials import ISSUER as CREDENTIAL_ISSUER
from haltwire.gateway.hosts import host_entry, origin_entry
from haltwire.gateway.model_config import ModelRoute, check_models
from haltwire.identity import Identity, IdentityKey, RefuseAt, TokenTable
from haltwire.listener import ListenerLimits
from haltwire.tripwires.calllog import CallLogSection
from haltwire.tripwires.rules import TripwireRule, TripwireStops, check_tripwires
from haltwire.tripwires.usage import check_model_rules


class ToolLimits(ConfigModel):
    """Per-tool overrides. A tool budget counts calls to this tool per identity."""

    budget: int | None = Field(default=None, ge=0)
    max_in_flight: int | None = Field(default=None, ge=1)
    deadline_s: float | None = Field(default=None, gt=0)


class LimitsOverride(ConfigModel):
    budget: int | None = Field(default=None, ge=0)
    window_s: float | None = Field(default=None, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1)
    deadline_s: float | None = Field(default=None, gt=0)
    #: Tool calls one run may make in all (counted for calls that present a lease).
    run_steps: int | None = Field(default=None, ge=0)
    tools: dict[str, ToolLimits] = Field(default_factory=dict)


class Limits(LimitsOverride):
    """Defaults for every identity. ``budget`` and ``max_in_flight`` absent: unlimited."""

    window_s: float = Field(default=3600.0, gt=0)
    deadline_s: float = Field(default=30.0, gt=0)


class IdentityConfig(TokenFields):
    agent: str = Field(min_length=1)
    tenant: str = "default"
    version: str = "0"
    suspended_at_edge: bool = False
    refuse_at: RefuseAt = "tool"
    #: Whether its tool calls must present a lease (issue 12): unset, they must whenever the
    #: gateway has ``[leases]`` (a call without one has no run, so no run stop could reach it);
    #: ``optional`` is the explicit opt-out; ``required`` needs ``[leases]``.
    lease: Literal["optional", "required"] | None = None
    limits: LimitsOverride = Field(default_factory=LimitsOverride)

    def identity(self) -> Identity:
        return Identity(
            agent=self.agent,
            tenant=self.tenant,
            version=self.version,
            suspended_at_edge=self.suspended_at_edge,
            refuse_at=self.refuse_at,
        )


class GatewaySection(ConfigModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8800, ge=0, le=65535)
    #: Connections, header and idle timeouts (``haltwire.listener``; no in-flight cap here: the
    #: per-identity ceilings do that).
    listener: ListenerLimits = Field(default_factory=ListenerLimits)
    #: Accept plain ``token`` entries. Never in production.
    development: bool = False
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    #: The kill switch: a JSON file ``{"suspended": ["agent-id", ...]}``.
    suspended_file: Path | None = None
    #: ``please-try-again`` exists only to show the seed's failure mode in ``haltwire demo loop``.
    refusal_style: Literal["terminal", "please-try-again"] = "terminal"
    #: Host values served besides loopback names and ``host`` (``haltwire.gateway.hosts``): the
    #: names clients reach this gateway by, ``NAME``, ``NAME:PORT`` or ``NAME:*``; others get 421.
    allowed_hosts: list[Annotated[str, AfterValidator(host_entry)]] = Field(default_factory=list)
    #: Origins of web pages allowed to call it besides its own and loopback pages
    #: (``SCHEME://NAME[:PORT]``, the port may be ``*``); others get 403, no Origin passes.
    allowed_origins: list[Annotated[str, AfterValidator(origin_entry)]] = Field(default_factory=list)


class LabelsSection(ConfigModel):
    """``[labels]``: the hard per-call deadline of each tool label, at the gateway."""

    cancellable_deadline_s: float = Field(default=30.0, gt=0)
    bounded_deadline_s: float = Field(default=30.0, gt=0)
    irreversible_deadline_s: float = Field(default=60.0, gt=0)

    def deadline_s(self, label: Label) -> float:
        if label == "cancellable":
            return self.cancellable_deadline_s
        if label == "bounded":
            return self.bounded_deadline_s
        return self.irreversible_deadline_s


class CountersSection(ConfigModel):
    backend: Literal["memory", "redis"] = "memory"
    #: The Redis server; with ``cluster``, one node of the cluster or several (a list: the first
    #: that answers at start-up tells the gateway the rest).
    url: str | list[str] = "redis://127.0.0.1:6379/0"
    #: Redis Cluster: every admission is one script per owner of its counters (an identity,
    #: and a tenant or an agent for the tripwires counted across identities).
    cluster: bool = False
    prefix: str = "haltwire"
    #: A slot held in Redis expires after this long, so a crashed gateway cannot hold it forever.
    #: It must outlast the longest deadline; the gateway checks that at start-up.
    slot_ttl_s: float = Field(default=300.0, gt=0)
    #: How long one admission (or release) may take, waiting for a pooled connection included.
    timeout_s: float = Field(default=0.5, gt=0)
    #: Connections to Redis this gateway may hold, shared by the counters and the idempotency
    #: records. Unset: ``[gateway.listener] max_connections``, as many as requests that can be
    #: answered at once (each makes one round trip at a time), so none waits for a connection.
    #: Smaller: round trips past it wait their turn, within ``timeout_s``.
    max_connections: int | None = Field(default=None, ge=1)


#: Idempotency keys are kept at least this long outside development (issue: 24 hours).
MIN_IDEMPOTENCY_TTL_S = 86400.0


class IdempotencySection(ConfigModel):
    """``[idempotency]``: how long a bounded tool's idempotency key and outcome are kept.

    The records live where the counters do (``[counters] backend``).
    """

    ttl_s: float = Field(default=MIN_IDEMPOTENCY_TTL_S, gt=0)
    #: With in-memory counters: keep the records in this SQLite file instead of in memory, so
    #: they outlive a gateway restart (relative to the config file).
    path: Path | None = None


class ExecutorSection(BearerToken):
    """``[executor]``: ``haltwire executor --config`` this file commits the intents this gateway
    records, through the same upstreams, with an executor-role token of its own for the control
    plane at ``[control] url``. One executor process per executor identity: a restart marks
    everything that identity had claimed ``unknown``."""

    _section: ClassVar[str] = "executor"
    #: The agent class of the executor's own lease (its timing, at the control plane).
    agent_class: str = Field(default="default", min_length=1)
    #: Intents settled at once (each one claimed, checked, performed and recorded in turn).
    workers: int = Field(default=1, ge=1, le=64)
    #: With nothing pending, how long to wait before asking again.
    poll_s: float = Field(default=0.2, gt=0)
    #: The first wait after a failed request to the control plane or the upstream (doubling to 10 s).
    retry_s: float = Field(default=0.5, gt=0)
    #: Serve ``/metrics`` on this port (of ``metrics_host``); unset: no metrics listener.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    #: The most intents the workers claim, check or settle in one control-plane write.
    batch_max: int = Field(default=64, ge=1, le=100)
    #: How long a batch waits for more workers' requests before it is sent (0: only those of
    #: the same event-loop pass; a request never waits longer than the one before it).
    batch_linger_s: float = Field(default=0.0, ge=0, le=1.0)


#: Public-key signatures only: a JWKS publishes verification keys, and an HMAC token "verified"
#: with a published key as its secret could be forged by anyone who read the JWKS.
ISSUER_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class IssuerSection(ConfigModel):
    """``[issuer]``: agent identities from an identity provider, as JWTs its JWKS verifies.

    A bearer token that is not in the token table and is a JWT from this issuer is verified
    (``haltwire.gateway.issuer``); the identity is named by its claims, and counts, stops and
    leases apply to it as to a configured identity with that agent id, tenant and version.
    """

    #: The issuer's identifier: a token's ``iss`` must be exactly this.
    iss: str = Field(min_length=1)
    jwks_url: str = Field(min_length=1)
    #: A token's ``aud`` must name this gateway (the MCP authorization spec's audience binding).
    audience: str = Field(min_length=1)
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "EdDSA"], min_length=1)
    agent_claim: str = Field(default="sub", min_length=1)
    #: Absent: every identity from the issuer is of tenant ``default`` (version ``0``).
    tenant_claim: str | None = Field(default=None, min_length=1)
    version_claim: str | None = Field(default=None, min_length=1)
    #: How long fetched keys are trusted; past it they are fetched again before any is used.
    keys_ttl_s: float = Field(default=300.0, gt=0)
    #: An unknown key id refetches the JWKS at most this often; a failed fetch waits as long.
    refresh_s: float = Field(default=30.0, gt=0)
    #: One fetch of the JWKS.
    timeout_s: float = Field(default=5.0, gt=0)
    refuse_at: RefuseAt = "tool"
    #: As an identity's ``lease``: unset, required whenever the gateway has ``[leases]``.
    lease: Literal["optional", "required"] | None = None
    #: Limits of every identity from the issuer (each counts on its own), over ``[limits]``.
    limits: LimitsOverride = Field(default_factory=LimitsOverride)

    @field_validator("algorithms")
    @classmethod
    def _public_key_algorithms(cls, algorithms: list[str]) -> list[str]:
        for alg in algorithms:
            if alg not in ISSUER_ALGORITHMS:
                raise ValueError(
                    f"{alg!r} is not a public-key signature algorithm a JWKS can verify; use "
                    + ", ".join(ISSUER_ALGORITHMS)
                )
        return algorithms

    @field_validator("jwks_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError("must be an http:// or https:// URL")
        return url


class IntentsSection(ConfigModel):
    """``[intents]``: calls to irreversible tools become intents for the executor (two-step).

    ``enabled`` unset: on when the gateway has ``[control]`` (intents live there), off without
    it (irreversible calls are then forwarded under their label's deadline). On, an irreversible
    call is performed only once an executor (``haltwire executor``) commits it.
    """

    enabled: bool | None = None


class TracingSection(ConfigModel):
    """``[tracing]``: OpenTelemetry spans for tool calls (the ``otel`` extra; ``gateway/tracing.py``).
    ``exporter`` unset: ``OTEL_TRACES_EXPORTER`` if set, else ``console``."""

    enabled: bool = False
    exporter: Literal["console", "otlp", "none"] | None = None

    @property
    def exporter_name(self) -> str:
        import os

        return self.exporter or os.environ.get("OTEL_TRACES_EXPORTER", "console").split(",")[0].strip()


class GatewayConfig(ConfigModel):
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    counters: CountersSection = Field(default_factory=CountersSection)
    idempotency: IdempotencySection = Field(default_factory=IdempotencySection)
    control: ControlLink | None = None
    #: The keys lease tokens are verified with; absent: tokens are ignored, none can be required.
    leases: LeaseKeysSection | None = None
    #: Run credentials accepted as bearer tokens; absent: only the token table's tokens are.
    broker: BrokerLink | None = None
    #: Agent identities from an identity provider; absent: only the token table's (and broker's).
    issuer: IssuerSection | None = None
    limits: Limits = Field(default_factory=Limits)
    labels: LabelsSection = Field(default_factory=LabelsSection)
    intents: IntentsSection = Field(default_factory=IntentsSection)
    executor: ExecutorSection | None = None
    identities: list[IdentityConfig] = Field(default_factory=list)
    upstreams: list[UpstreamConfig] = Field(min_length=1)
    #: Model providers for model calls (``haltwire.gateway.model_config``); none: no model endpoints.
    models: list[ModelRoute] = Field(default_factory=list)
    #: Per-call tripwire rules (``haltwire.tripwires.rules``); none: no per-call work.
    tripwires: list[TripwireRule] = Field(default_factory=list)
    tripwire_stops: TripwireStops | None = None
    #: One record per call, for ``haltwire tripwires test`` (``haltwire.tripwires.calllog``).
    call_log: CallLogSection | None = None
    tracing: TracingSection = Field(default_factory=TracingSection)

    @property
    def intents_on(self) -> bool:
        """Whether irreversible calls become intents (``[intents] enabled``, by default with ``[control]``)."""
        return self.control is not None if self.intents.enabled is None else self.intents.enabled

    @field_validator("identities")
    @classmethod
    def _one_identity_per_token(cls, identities: list[IdentityConfig]) -> list[IdentityConfig]:
        # Several versions (and tenants) of one agent id are identities of their own; a token
        # names exactly one of them (a dict keyed by its hash let the last win), and each
        # identity has one entry (its limits and lease policy are that entry's).
        tokens: dict[str, int] = {}
        keys: dict[tuple[str, str, str], int] = {}
        for n, i in enumerate(identities):
            if (first := tokens.setdefault(i.digest, n)) != n:
                raise ValueError(f"[{first}] and [{n}] have the same token; a token names one identity")
            if (first := keys.setdefault((i.agent, i.tenant, i.version), n)) != n:
                raise ValueError(
                    f"[{first}] and [{n}] are both agent {i.agent} version {i.version} of tenant {i.tenant}; "
                    "give each identity one entry"
                )
        return identities

    @model_validator(mode="after")
    def _consistent(self) -> GatewayConfig:
        names = [u.name for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError("upstreams: names must be unique")
        if not self.gateway.development and any(i.token is not None for i in self.identities):
            raise ValueError(
                "identities: plain 'token' is accepted only with gateway.development = true; use token_sha256"
            )
        if self.control is not None and self.control.token is not None and not self.gateway.development:
            raise ValueError(
                "control: plain 'token' is accepted only with gateway.development = true; use token_env"
            )
        if self.leases is not None:
            if self.leases.signing_key is not None:
                # HMAC verifies with the signing secret anyway; the key is refused so that a
                # gateway config never reads as if the gateway issued leases.
                raise ValueError("leases.signing_key: a gateway only verifies lease tokens; remove it")
            if self.leases.plain_secrets() and not self.gateway.development:
                raise ValueError(
                    "leases.keys: plain 'secret' is accepted only with gateway.development = true; use secret_env"
                )
        if self.idempotency.ttl_s < MIN_IDEMPOTENCY_TTL_S and not self.gateway.development:
            raise ValueError(
                f"idempotency.ttl_s ({self.idempotency.ttl_s:g}) must be at least "
                f"{MIN_IDEMPOTENCY_TTL_S:g} (24 hours) outside development"
            )
        if self.executor is not None:
            if self.control is None:
                raise ValueError("executor: the executor works with a control plane; add [control]")
            if self.executor.token is not None and not self.gateway.development:
                raise ValueError(
                    "executor: plain 'token' is accepted only with gateway.development = true; use token_env"
                )
        if self.broker is not None and self.control is None:
            # A credential is revoked by stops: a gateway that does not follow them cannot tell.
            raise ValueError("broker: accepting run credentials needs [control] (its stops revoke them)")
        if self.issuer is not None:
            self._check_issuer(self.issuer)
        required = [i.agent for i in self.identities if i.lease == "required"]
        if required and self.leases is None:
            raise ValueError(
                f"identities: {', '.join(required)} require a lease, but there is no [leases] section "
                "to verify one with"
            )
        longest = max(self._deadlines(), default=self.limits.deadline_s)
        if isinstance(self.counters.url, list) and not (self.counters.cluster and self.counters.url):
            raise ValueError("counters.url is a list only for a Redis Cluster's nodes (counters.cluster = true)")
        if self.counters.backend == "redis" and self.counters.slot_ttl_s <= longest:
            raise ValueError(
                f"counters.slot_ttl_s ({self.counters.slot_ttl_s:g}) must exceed the longest deadline "
                f"({longest:g} s), or a slow call's slot would expire while it runs"
            )
        if self.intents.enabled is True and self.control is None:
            raise ValueError("intents.enabled needs [control]: intents are recorded in the control plane")
        if not self.gateway.development:
            for n, upstream in enumerate(self.upstreams):
                if upstream.headers:  # they hold the upstream's credentials, as tokens do
                    first = next(iter(upstream.headers))
                    raise ValueError(
                        f"upstreams[{n}].headers: plain header values are accepted only with "
                        "gateway.development = true; put each value in an environment variable and "
                        f'name it instead: headers_env = {{ "{first}" = "ENV_VAR" }}'
                    )
        check_tripwires(self.tripwires, self.tripwire_stops, self.control, self.gateway.development)
        check_models(self.models, self.gateway.development)
        names = [f"model:{n}" for m in self.models for n in (*m.models, *(f"{p}*" for p in m.prefixes))]
        check_model_rules(self.tripwires, names, any(m.prices for m in self.models))
        return self

    def _check_issuer(self, issuer: IssuerSection) -> None:
        if not self.gateway.development and urlsplit(issuer.jwks_url).scheme != "https":
            raise ValueError(
                "issuer.jwks_url: keys fetched over plain http could be replaced on the way; use https "
                "(plain http only with gateway.development = true)"
            )
        if self.broker is not None and issuer.iss == CREDENTIAL_ISSUER:
            raise ValueError(
                f"issuer.iss: {CREDENTIAL_ISSUER!r} names the broker's credentials; use the issuer's own"
            )
        if issuer.lease == "required" and self.leases is None:
            raise ValueError(
                "issuer.lease: a lease is required, but there is no [leases] section to verify one with"
            )

    def _deadlines(self) -> list[float]:
        # A call's deadline is the smaller of its limits' and its label's; both lists are
        # included, which errs on the long side (a slot outliving its call is harmless).
        lb = self.labels
        out = [
            self.limits.deadline_s,
            lb.cancellable_deadline_s,
            lb.bounded_deadline_s,
            lb.irreversible_deadline_s,
        ]
        overrides = [self.limits, *(i.limits for i in self.identities)]
        if self.issuer is not None:
            overrides.append(self.issuer.limits)
        for o in overrides:
            if o.deadline_s is not None:
                out.append(o.deadline_s)
            out.extend(t.deadline_s for t in o.tools.values() if t.deadline_s is not None)
        return out

    def lease_optional(self) -> list[IdentityKey]:
        """The identities whose tool calls may go without a lease (``lease = "optional"``); with
        ``[leases]``, every other identity's must present one (issue 12)."""
        return [i.identity().key for i in self.identities if i.lease == "optional"]

    def token_table(self) -> TokenTable:
        return TokenTable({i.digest: i.identity() for i in self.identities})


def parse_config(data: dict[str, Any], source: str = "<config>") -> GatewayConfig:
    return validate_config(GatewayConfig, data, source)


def load_config(path: str | Path) -> GatewayConfig:
    p = Path(path)
    config = parse_config(read_toml(p), str(p))
    if config.gateway.suspended_file is not None and not config.gateway.suspended_file.is_absolute():
        # A relative kill-switch path is relative to the config file, not the working directory.
        gw = config.gateway.model_copy(update={"suspended_file": p.parent / config.gateway.suspended_file})
        config = config.model_copy(update={"gateway": gw})
    records = config.idempotency.path
    if records is not None and not records.is_absolute():
        idempotency = config.idempotency.model_copy(update={"path": p.parent / records})
        config = config.model_copy(update={"idempotency": idempotency})
    # A file in a folder that is not there: the kill switch would never be read (nobody is ever
    # suspended), the records never written. Said at start-up, not at the first call.
    for key, file in (
        ("gateway.suspended_file", config.gateway.suspended_file),
        ("idempotency.path", config.idempotency.path),
    ):
        if file is not None and not file.parent.is_dir():
            raise ConfigError(f"{p}: {key}: the folder {file.parent} does not exist")
    return config
