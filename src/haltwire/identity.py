"""Identities: who calls, resolved from the bearer token and nothing else.

An identity is an agent id, a tenant and a version: several versions (a canary beside the
stable one) and several tenants may share one agent id, each an identity of its own. Every
ceiling is keyed by the identity a token resolves to, never by a connection or a session, so a
client that reconnects, or starts a new session, is still the same caller. Tokens are kept as
SHA-256 hashes; the lookup hashes the presented token and reads a dict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

RefuseAt = Literal["tool", "edge"]
#: (agent, tenant, version): what tells one identity from another.
IdentityKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Identity:
    """An agent identity: ``agent``, ``tenant`` and ``version`` together (``key``) tell it apart."""

    agent: str
    tenant: str = "default"
    version: str = "0"
    role: str = "agent"
    #: Suspended at the HTTP edge: every request gets 403 before any MCP processing.
    suspended_at_edge: bool = False
    #: Where this identity's refusals are answered: as tool results (default) or as
    #: HTTP statuses at the edge (401/403/429/503), as a plain HTTP gateway would.
    refuse_at: RefuseAt = "tool"
    #: Who vouched for it: None for a token of the gateway's own table, else the issuer (its
    #: ``iss``) whose signed JWT named it.
    issuer: str | None = None

    #: ``TENANT/AGENT``, percent-encoded (no ``/``, ``@``, ``:`` or braces inside): the agent
    #: within its tenant, whatever its version. Idempotency keys belong to it, so a key is never
    #: answered across tenants, and a repeat survives a switch between versions.
    owner: str = field(init=False, repr=False, compare=False)
    #: ``TENANT/AGENT@VERSION``, percent-encoded: the one name this identity's counters live under.
    counted_as: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Computed once: the counters' name is read on every admission.
        owner = f"{quote(self.tenant, safe='')}/{quote(self.agent, safe='')}"
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "counted_as", f"{owner}@{quote(self.version, safe='')}")

    @property
    def key(self) -> IdentityKey:
        return (self.agent, self.tenant, self.version)


# The names counts across identities live under, beside ``counted_as`` (``*`` is percent-encoded
# in a name, so neither can be an identity's): on Redis Cluster each name is one slot.


def tenant_counted_as(tenant: str) -> str:
    """``TENANT/*``: every identity of a tenant."""
    return f"{quote(tenant, safe='')}/*"


def agent_counted_as(agent: str) -> str:
    """``*/AGENT``: an agent in every tenant and version."""
    return f"*/{quote(agent, safe='')}"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenTable:
    """Maps SHA-256 token hashes to identities."""

    def __init__(self, by_hash: dict[str, Identity]) -> None:
        self._by_hash = dict(by_hash)

    def resolve(self, token: str) -> Identity | None:
        # A dict lookup on a hash of the token: the hash is what is compared, so the
        # lookup leaks nothing useful about stored tokens through timing.
        return self._by_hash.get(token_sha256(token))

    def __len__(self) -> int:
        return len(self._by_hash)


def bearer_token(authorization: str | None) -> str | None:
    """The token from an ``Authorization: Bearer ...`` header value, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
