"""``[[models]]``: the model providers the gateway forwards model calls to (issue 14).

Each entry is one provider: where it is (``base_url``, the OpenAI-compatible API root such as
``https://api.openai.com/v1``), the environment variable holding its API key (``api_key_env``,
read at start-up: the key never appears in the config, in a response or in a log), and which
model names route there: ``models`` (exact names) and ``prefixes`` (``gpt-`` routes every model
whose name starts so). An exact name wins over a prefix, and the longest prefix over shorter
ones; one name or one prefix in two entries is a config error.

``prices`` (optional) says what a model's tokens cost, per million input and output tokens, in
whatever currency the operator counts in; the gateway counts each call's cost beside its tokens
(``haltwire.gateway.usage``), in millionths of that unit. A model without a price (and no
``"*"`` entry) counts no money.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from haltwire.config import ConfigModel, from_env

#: An environment variable's name, as a shell spells one.
_VARIABLE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ModelPrice(ConfigModel):
    """What a model's tokens cost, per million."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)

    def micros(self, input_tokens: int, output_tokens: int) -> int:
        """The cost of a call, in millionths of the price's unit."""
        return round(input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok)


class ModelRoute(ConfigModel):
    """One ``[[models]]`` entry."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    #: The provider's API root; a call to ``/v1/chat/completions`` goes to ``BASE/chat/completions``.
    base_url: str = Field(min_length=1)
    #: The environment variable holding the provider's API key, sent as ``Authorization: Bearer``.
    api_key_env: str = Field(min_length=1)
    #: Model names routed here, exactly.
    models: list[str] = Field(default_factory=list)
    #: Model name prefixes routed here.
    prefixes: list[str] = Field(default_factory=list)
    #: Seconds to connect to the provider; past it the call is refused ``upstream_unavailable``.
    connect_timeout_s: float = Field(default=10.0, gt=0)
    #: Model name (``"*"``: any other model routed here) to its price.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    #: Whether a call counts as a step of the identity's ``budget`` and the run's ``run_steps``
    #: (false: only ``[limits.tools."model:NAME"]``, the in-flight caps and the tripwires count it).
    counts_as_step: bool = True

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        if parts.query or parts.fragment:
            raise ValueError("must hold no query or fragment")
        return url.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _variable(cls, variable: str) -> str:
        if not _VARIABLE.fullmatch(variable):
            raise ValueError(f"{variable!r} is not the name of an environment variable")
        return variable

    @field_validator("models", "prefixes")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for n in names:
            if not n or n != n.strip():
                raise ValueError(f"{n!r}: a model name or prefix is not empty and not padded")
        return names

    @model_validator(mode="after")
    def _routes_something(self) -> ModelRoute:
        if not self.models and not self.prefixes:
            raise ValueError(f"models[{self.name}]: give the model names (models) or prefixes it serves")
        return self

    def price(self, model: str) -> ModelPrice | None:
        return self.prices.get(model, self.prices.get("*"))

    def api_key(self, key: str) -> str:
        """The provider's key from the environment; ``ConfigError`` naming ``KEY.api_key_env`` and
        the variable when it is not set (a start-up error)."""
        return from_env(f"{key}.api_key_env", self.api_key_env)


def check_models(models: list[ModelRoute], development: bool) -> None:
    """Names unique, no model name or prefix routed twice, https outside development."""
    names: set[str] = set()
    exact: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    for n, m in enumerate(models):
        if m.name in names:
            raise ValueError(f"models[{n}]: another entry is named {m.name!r}; names must be unique")
        names.add(m.name)
        if not development and urlsplit(m.base_url).scheme != "https":
            raise ValueError(
                f"models[{n}].base_url: the provider's key would cross the network in plain text; use "
                "https (plain http only with gateway.development = true)"
            )
        for model in m.models:
            if (other := exact.setdefault(model, m.name)) != m.name:
                raise ValueError(f"models[{n}]: model {model!r} is routed by {other!r} already")
        for prefix in m.prefixes:
            if (other := prefixes.setdefault(prefix, m.name)) != m.name:
                raise ValueError(f"models[{n}]: prefix {prefix!r} is routed by {other!r} already")
