"""``[[notify]]``: who is paged, for what, and how (the receivers of ``haltwire.control.notify``).

A receiver is a generic JSON webhook, a Slack incoming webhook or PagerDuty's Events API v2. Its
secrets (a Slack webhook's URL, PagerDuty's routing key, a webhook's signing key) come from the
environment (``*_env``), read at start-up; in plain text only with ``control.development = true``.
"""

from __future__ import annotations

import os
from typing import Final, Literal

from pydantic import Field, model_validator

from haltwire.config import ConfigError, ConfigModel

#: What a receiver may be paged for: a stop, an escalation, a shadow rule's "would have stopped".
PageEvent = Literal["stop", "escalation", "shadow"]
Severity = Literal["critical", "error", "warning", "info"]
#: The scope kinds a ``[[notify]]`` entry's ``scopes`` may name (or a whole scope, ``tenant:acme``).
SCOPE_KINDS: Final = ("run", "tenant", "tool", "model", "agent", "version", "global")
PAGE_EVENTS: Final[tuple[PageEvent, ...]] = ("stop", "escalation", "shadow")
SEVERITY: Final[dict[PageEvent, Severity]] = {
    "stop": "critical",
    "escalation": "critical",
    "shadow": "warning",
}
#: PagerDuty's Events API v2 endpoint, the default ``url`` of a ``pagerduty`` receiver.
PAGERDUTY_URL: Final = "https://events.pagerduty.com/v2/enqueue"


class NotifyTarget(ConfigModel):
    """``[[notify]]``: one receiver of pages (``haltwire.control.notify``): a generic JSON webhook,
    a Slack incoming webhook, or PagerDuty's Events API v2.

    The address from ``url_env`` (an environment variable) or ``url``; a Slack webhook's URL is its
    secret, so a plain ``url`` for ``slack`` is development only. PagerDuty's routing key likewise
    (``routing_key_env``; plain ``routing_key`` in development). A ``webhook`` may sign its bodies
    with ``secret_env`` (``Haltwire-Signature``). ``on`` and ``scopes`` filter what is sent.
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["webhook", "slack", "pagerduty"]
    url: str | None = None
    url_env: str | None = None
    #: ``webhook``: the environment variable holding the HMAC-SHA256 key bodies are signed with.
    secret_env: str | None = None
    routing_key: str | None = None
    routing_key_env: str | None = None
    on: list[PageEvent] = Field(default_factory=lambda: list(PAGE_EVENTS), min_length=1)
    #: Scope kinds (``"run"``) or whole scopes (``"tenant:acme"``); empty: every scope.
    scopes: list[str] = Field(default_factory=list)
    #: One attempt's deadline (connect, send, answer).
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    #: The wait after a failed attempt, doubled after each, up to ``max_retry_s``.
    first_retry_s: float = Field(default=1.0, gt=0)
    max_retry_s: float = Field(default=300.0, gt=0)
    #: A page still not delivered this long after it was written is given up (audited).
    give_up_after_s: float = Field(default=86_400.0, gt=0)
    #: Past this many pages waiting for the receiver, the oldest are dropped (audited).
    max_pending: int = Field(default=1000, ge=1)
    #: The control plane's address as an operator reaches it (its admin listener): a run's page
    #: links ``{report_url_base}/v1/runs/{run_id}/report``.
    report_url_base: str | None = None
    #: PagerDuty's severity per event.
    severity: dict[PageEvent, Severity] = Field(default_factory=lambda: dict(SEVERITY))

    @model_validator(mode="after")
    def _consistent(self) -> NotifyTarget:
        if self.kind == "pagerduty":
            if (self.routing_key is None) == (self.routing_key_env is None):
                raise ValueError("routing_key_env: give exactly one of routing_key_env or routing_key")
        elif self.routing_key is not None or self.routing_key_env is not None:
            raise ValueError(f"routing_key_env: only for kind 'pagerduty', not {self.kind!r}")
        if self.url is not None and self.url_env is not None:
            raise ValueError("url_env: give one of url_env or url, not both")
        if self.url is None and self.url_env is None and self.kind != "pagerduty":
            raise ValueError("url_env: give url_env (or url)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url: an http:// or https:// URL")
        if self.secret_env is not None and self.kind != "webhook":
            raise ValueError(f"secret_env: only for kind 'webhook', not {self.kind!r}")
        if self.report_url_base is not None and not self.report_url_base.startswith(("http://", "https://")):
            raise ValueError("report_url_base: an http:// or https:// URL")
        if self.first_retry_s > self.max_retry_s:
            raise ValueError(
                f"first_retry_s ({self.first_retry_s:g}) must not exceed max_retry_s ({self.max_retry_s:g})"
            )
        for scope in self.scopes:
            kind, colon, rest = scope.partition(":")
            if kind not in SCOPE_KINDS or (colon and not rest) or (kind == "global" and colon):
                raise ValueError(
                    f"scopes: {scope!r} is neither a scope kind ({', '.join(SCOPE_KINDS)}) nor a scope"
                )
        return self

    def plain_secrets(self) -> list[str]:
        """The keys holding a secret in plain text (refused outside development)."""
        return (["url"] if self.kind == "slack" and self.url is not None else []) + (
            ["routing_key"] if self.routing_key is not None else []
        )

    def _env(self, key: str, name: str) -> str:
        value = os.environ.get(name, "").strip()
        if not value:
            raise ConfigError(f"notify.{self.name}.{key}: the environment variable {name} is not set")
        return value

    def address(self) -> str:
        """The URL pages are posted to; ``ConfigError`` naming the key when its variable is unset."""
        if self.url is not None:
            return self.url
        if self.url_env is None:
            return PAGERDUTY_URL
        url = self._env("url_env", self.url_env)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"notify.{self.name}.url_env: {self.url_env} holds no http:// or https:// URL")
        return url

    def key(self) -> str | None:
        """PagerDuty's routing key, or None for another kind."""
        if self.routing_key_env is not None:
            return self._env("routing_key_env", self.routing_key_env)
        return self.routing_key

    def signing_secret(self) -> bytes | None:
        return None if self.secret_env is None else self._env("secret_env", self.secret_env).encode()

    def wants(self, event: str, scope: str) -> bool:
        """Whether this receiver is paged for ``event`` on ``scope``."""
        if event not in self.on:
            return False
        return not self.scopes or any(s in (scope, scope.partition(":")[0]) for s in self.scopes)


def check_receivers(targets: list[NotifyTarget], development: bool) -> None:
    """Names unique; plain secrets only in development (``ValueError`` naming the key)."""
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError("notify: names must be unique")
    if not development:
        for target in targets:
            for key in target.plain_secrets():
                raise ValueError(
                    f"notify.{target.name}.{key}: a plain secret is accepted only with "
                    f"control.development = true; use {key}_env"
                )
