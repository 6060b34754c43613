"""What every haltwire config file shares: validation with errors that name file, key and problem.

A bad config is a start-up error phrased ``FILE: KEY: PROBLEM`` (``ConfigError``; the CLI
exits 2), never a crash on the first call. The gateway's schema is ``haltwire.gateway.config``,
the control plane's ``haltwire.control.config``; the tables both use (bearer tokens for the
control plane, lease keys, upstreams, which the executor connects to as well) are here.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from haltwire.identity import token_sha256
from haltwire.tokens import LeaseKeys


class ConfigError(Exception):
    """A configuration problem, phrased as ``FILE: KEY: PROBLEM``."""


def from_env(key: str, variable: str) -> str:
    """The value of the environment variable ``variable``, which the config's ``key`` names (a
    token, a lease secret, an upstream's header, ...): read at start-up, and a ``ConfigError``
    naming both when it is unset or blank. Secrets outside development come this way only."""
    value = os.environ.get(variable, "")
    if not value.strip():
        raise ConfigError(f"{key}: the environment variable {variable} is not set")
    return value


#: A header's name (RFC 9110 ``token``).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: A variable's name: anything an environment holds (no ``=``, no NUL).
_VARIABLE = re.compile(r"[^=\x00]+")


class ConfigModel(BaseModel):
    """Base of every config table: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: How far a call to a tool can be taken back (``haltwire.upstreams.labels``).
Label = Literal["cancellable", "bounded", "irreversible"]


class TokenFields(ConfigModel):
    """An identity's bearer token, as its SHA-256 (``token_sha256``) or, in development, in plain."""

    token_sha256: str | None = None
    token: str | None = None

    @field_validator("token_sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("must be 64 lowercase hex digits (the SHA-256 of the token)")
        return v

    @model_validator(mode="after")
    def _one_token(self) -> TokenFields:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token_sha256 or token")
        return self

    @property
    def digest(self) -> str:
        return self.token_sha256 or token_sha256(self.token or "")


class UpstreamConfig(ConfigModel):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    url: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    #: Sent with every request to an HTTP upstream, in plain text: development only (the
    #: gateway's config refuses them otherwise), since they hold the upstream's credentials.
    headers: dict[str, str] = Field(default_factory=dict)
    #: Header name -> the environment variable holding its value, read at start-up
    #: (``resolve_headers``): how a shared API key reaches the upstream outside development.
    headers_env: dict[str, str] = Field(default_factory=dict)
    prefix: str = ""
    #: Seconds to wait for the upstream to start and list its tools.
    connect_timeout_s: float = Field(default=15.0, gt=0)
    #: Labels by the upstream's own tool names; they win over its annotations.
    labels: dict[str, Label] = Field(default_factory=dict)
    #: Read unlabelled tools' labels from their MCP annotations; false: they are irreversible.
    trust_annotations: bool = True
    #: Irreversible tools (the upstream's names) whose intents wait for ``haltwire approve``.
    approval: list[str] = Field(default_factory=list)

    @field_validator("headers", "headers_env")
    @classmethod
    def _header_names(cls, headers: dict[str, str]) -> dict[str, str]:
        for name in headers:
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a header name")
        return headers

    @field_validator("headers_env")
    @classmethod
    def _variables(cls, headers_env: dict[str, str]) -> dict[str, str]:
        for name, variable in headers_env.items():
            if not _VARIABLE.fullmatch(variable):
                raise ValueError(f"{name}: give the name of an environment variable holding the header's value")
        return headers_env

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of url (streamable HTTP) or command (stdio)")
        if self.command is not None and not self.command:
            raise ValueError("command must not be empty")
        plain = {name.lower() for name in self.headers}
        for name in self.headers_env:
            if name.lower() in plain:
                raise ValueError(f"{name} is in both headers and headers_env; give it once")
        return self

    def resolve_headers(self, key: str) -> dict[str, str]:
        """Every header for this upstream: ``headers``, and each of ``headers_env`` from the
        environment; a ``ConfigError`` naming ``KEY.headers_env.NAME`` and the variable when one
        is not set (``key`` says which upstream: ``upstreams[0]``)."""
        found = {name: from_env(f"{key}.headers_env.{name}", var) for name, var in self.headers_env.items()}
        return {**self.headers, **found}


class BearerToken(ConfigModel):
    """A bearer token for the control plane: ``token`` in plain (development) or ``token_env``."""

    #: The config section, for error messages.
    _section: ClassVar[str] = "control"
    token: str | None = None
    #: The name of an environment variable holding the token.
    token_env: str | None = None

    @model_validator(mode="after")
    def _one_token(self) -> Self:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give exactly one of token or token_env")
        return self

    def resolve_token(self) -> str:
        if self.token is not None:
            return self.token
        assert self.token_env is not None
        return from_env(f"{self._section}.token_env", self.token_env)


class ControlLink(BearerToken):
    """The control plane whose stops this gateway enforces (``[control]``; absent: standalone).

    ``token`` / ``token_env``: the gateway-role bearer token (plain only with
    ``gateway.development = true``)."""

    #: The control plane: one URL, or a list of its replicas' URLs (followed one at a time).
    url: str | list[str]
    #: With nothing heard for this long, every call is refused ``registry_unreachable``.
    #: It must exceed the control plane's ``heartbeat_s``.
    staleness_s: float = Field(default=15.0, gt=0)
    #: With several URLs: a watch silent this long is left for the next replica, so a hung
    #: replica is replaced before the gateway goes stale. Default: half of ``staleness_s``; it
    #: must exceed the control plane's ``heartbeat_s`` too.
    failover_s: float | None = Field(default=None, gt=0)
    #: Start-up: how long to wait for the control plane and the replay of its stops.
    connect_timeout_s: float = Field(default=15.0, gt=0)

    @field_validator("url")
    @classmethod
    def _urls(cls, url: str | list[str]) -> str | list[str]:
        urls = [url] if isinstance(url, str) else url
        if not urls or any(not u.strip() for u in urls):
            raise ValueError("give the control plane's URL, or a non-empty list of its replicas' URLs")
        if len(set(urls)) != len(urls):
            raise ValueError("the replicas' URLs must be unique")
        return url

    @model_validator(mode="after")
    def _failover_within_staleness(self) -> Self:
        if self.failover_s is not None and self.failover_s >= self.staleness_s:
            raise ValueError(
                f"failover_s ({self.failover_s:g}) must be below staleness_s ({self.staleness_s:g}): "
                "a replica is left before the stops go stale"
            )
        return self

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url,) if isinstance(self.url, str) else tuple(self.url)

    @property
    def silence_s(self) -> float:
        """How long a watch may hear nothing before it is abandoned: the staleness bound with one
        replica (there is nowhere else to go), ``failover_s`` with several."""
        if len(self.urls) == 1:
            return self.staleness_s
        return self.failover_s if self.failover_s is not None else self.staleness_s / 2


class LeaseKeyConfig(ConfigModel):
    """One lease-token key (``[[leases.keys]]``): its id and its secret, from the environment.

    ``secret`` in plain text is for development configs only (the config's ``development``).
    """

    kid: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    secret: str | None = None
    secret_env: str | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> LeaseKeyConfig:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError("give exactly one of secret or secret_env")
        return self

    def resolve(self) -> bytes:
        if self.secret is not None:
            return self.secret.encode()
        assert self.secret_env is not None
        return from_env("leases.keys", self.secret_env).encode()


class LeaseKeysSection(ConfigModel):
    """``[leases]``: the keys lease tokens are verified with, and (control plane) signed with."""

    #: The key id new tokens are signed with (control plane only; a gateway only verifies).
    signing_key: str | None = None
    keys: list[LeaseKeyConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> LeaseKeysSection:
        kids = [k.kid for k in self.keys]
        if len(set(kids)) != len(kids):
            raise ValueError("keys: key ids must be unique")
        if self.signing_key is not None and self.signing_key not in kids:
            raise ValueError(f"signing_key {self.signing_key!r} is not among the keys")
        return self

    def plain_secrets(self) -> bool:
        return any(k.secret is not None for k in self.keys)

    def lease_keys(self) -> LeaseKeys:
        """The key set; raises ``ConfigError`` when a secret is missing or too short."""
        try:
            return LeaseKeys({k.kid: k.resolve() for k in self.keys}, signing=self.signing_key)
        except ValueError as exc:
            raise ConfigError(f"leases.keys: {exc}") from None


def error_key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


ModelT = TypeVar("ModelT", bound=BaseModel)


def validate_config(model: type[ModelT], data: dict[str, Any], source: str) -> ModelT:
    """``model`` from ``data``, or a ``ConfigError`` listing every problem as ``SOURCE: KEY: PROBLEM``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{source}: {error_key(tuple(err['loc']))}: {msg}")
        raise ConfigError("\n".join(problems)) from None


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables, or a ``ConfigError`` naming the file and the problem."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror}") from None
    try:
        return tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


class BrokerLink(ConfigModel):
    """``[broker]``: accept the control plane's run credentials (the gateway: as bearer tokens,
    ``haltwire.gateway.credentials``; the egress proxy: as proxy credentials).

    At the gateway, a bearer token that is not in the token table and has the JWT shape is
    verified with the broker's JWKS: the identity is the configured one with the credential's
    agent (tenant and version must match too), and the credential's run becomes the call's run.
    """

    jwks_url: str = Field(min_length=1)
    #: The audience the broker issued the credential for (the ``aud`` claim).
    audience: str = Field(default="haltwire-gateway", min_length=1)
    #: An unknown key id refetches the JWKS at most this often.
    refresh_s: float = Field(default=30.0, gt=0)
