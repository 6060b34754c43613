"""Agent identities from an identity provider: JWTs from ``[issuer]``, verified with its JWKS.

Platforms at scale issue agent identities from an identity provider rather than a config table.
As the MCP authorization spec has a resource server do, the gateway accepts a bearer JWT only
when all of this holds, and answers 401 otherwise:

1. its ``alg`` is one of ``[issuer] algorithms`` (public-key signatures only: never ``none``,
   never HMAC) and it names its key (``kid``);
2. that key is in the issuer's JWKS (``IssuerKeys``) and the signature holds;
3. ``iss`` is the issuer's and ``aud`` names this gateway;
4. it has not expired (``exp`` is required), and is valid already (``nbf``), by the gateway's
   own clock with no leeway, as for leases;
5. the configured claims name the agent (and the tenant and version, when configured): printable
   strings a stop can name.

The identity is then ``Identity(agent, tenant, version, issuer=iss)``: stops, leases and ceilings
apply to it as to a configured identity with the same agent id, tenant and version.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import anyio
import anyio.to_thread
import jwt

from haltwire import refusal
from haltwire.gateway.config import IssuerSection
from haltwire.identity import Identity
from haltwire.limits import MAX_NAME_CHARS, has_control_characters
from haltwire.refusal import Refusal

log = logging.getLogger("haltwire.gateway")


class KeysUnavailable(Exception):
    """No key to verify a token with: the JWKS cannot be had, or has no such key id."""


class IssuerKeys:
    """The issuer's public keys, fetched, parsed and cached by PyJWT's ``PyJWKClient``.

    The client keeps the JWK set for ``ttl_s`` (its ``lifespan``) and fetches with ``timeout_s``;
    its per-kid cache stays off, since that one never expires and a key the issuer withdrew
    would stay trusted. When to fetch again is decided here, because the client's own cooldown
    counts only successful fetches (an issuer that is down would be asked on every request):

    - a kid in the set fetched less than ``ttl_s`` ago: that key, without leaving the event loop;
    - no set that fresh: fetch, unless a fetch failed less than ``refresh_s`` ago (then refuse);
    - a fresh set without the kid (a rotated-in key, or a made-up one): refetch, at most once
      per ``refresh_s``, so tokens with invented key ids cannot hammer the issuer.

    Fetches run in a worker thread (the client blocks on urllib), one at a time.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 300.0,
        refresh_s: float = 30.0,
        timeout_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.client = jwt.PyJWKClient(
            url, cache_keys=False, cache_jwk_set=True, lifespan=ttl_s, timeout=timeout_s
        )
        self._monotonic = monotonic
        self._fetched_at = -math.inf  # the last attempt, failed or not
        self._failed_at = -math.inf
        self._lock = anyio.Lock()

    def _fresh(self) -> jwt.PyJWKSet | None:
        cache = self.client.jwk_set_cache
        return cache.get() if cache is not None else None

    async def fetch(self) -> jwt.PyJWKSet:
        """Fetch the JWKS now; raises ``KeysUnavailable`` when it cannot."""
        self._fetched_at = self._monotonic()
        try:
            return await anyio.to_thread.run_sync(lambda: self.client.get_jwk_set(refresh=True))
        except jwt.PyJWTError as exc:
            raise KeysUnavailable(f"the issuer's keys at {self.url} cannot be fetched ({exc})") from None

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key ``kid``; raises ``KeysUnavailable`` when there is none to verify with."""
        key = _signing_key(self._fresh(), kid)
        if key is not None:
            return key
        async with self._lock:
            fresh = self._fresh()  # perhaps fetched while this call waited for the lock
            key = _signing_key(fresh, kid)
            if key is not None:
                return key
            now = self._monotonic()
            if fresh is None and now - self._failed_at < self.refresh_s:
                raise KeysUnavailable(f"the issuer's keys at {self.url} cannot be fetched now")
            if fresh is not None and now - self._fetched_at < self.refresh_s:
                raise KeysUnavailable(f"the issuer has no key {kid!r}")
            try:
                fetched = await self.fetch()
            except KeysUnavailable as exc:
                self._failed_at = self._monotonic()
                log.warning("issuer: %s", exc)
                raise
            key = _signing_key(fetched, kid)
            if key is None:
                raise KeysUnavailable(f"the issuer has no key {kid!r}")
            return key


def _signing_key(jwk_set: jwt.PyJWKSet | None, kid: str) -> jwt.PyJWK | None:
    if jwk_set is None:
        return None
    return next((k for k in jwk_set.keys if k.key_id == kid and k.public_key_use in ("sig", None)), None)


class IssuerEdge:
    """Resolves a JWT from the configured issuer to the identity its claims name."""

    def __init__(
        self,
        config: IssuerSection,
        keys: IssuerKeys | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.keys = keys or IssuerKeys(
            config.jwks_url, ttl_s=config.keys_ttl_s, refresh_s=config.refresh_s, timeout_s=config.timeout_s
        )
        self._algorithms = list(config.algorithms)
        self._clock = clock

    async def resolve(self, token: str) -> Identity | Refusal:
        c = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            return refusal.unauthenticated(f"the token cannot be read: {exc}")
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self._algorithms:
            # Before any key is looked up: "none" and HMAC never reach the verifier.
            return refusal.unauthenticated(
                f"the token is signed with {alg!r}; this gateway accepts {', '.join(self._algorithms)}"
            )
        if not isinstance(kid, str) or not kid:
            return refusal.unauthenticated("the token names no key (kid)")
        try:
            key = await self.keys.key(kid)
        except KeysUnavailable as exc:
            return refusal.unauthenticated(str(exc))
        try:
            raw = jwt.decode(
                token,
                key,
                algorithms=self._algorithms,
                audience=c.audience,
                issuer=c.iss,
                # Expiry and not-before are judged below, on this gateway's clock, no leeway.
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "require": ["exp", "iss", "aud"],
                },
            )
        except jwt.PyJWTError as exc:
            return refusal.unauthenticated(f"the token is not valid: {exc}")
        now = self._clock()
        exp, nbf = raw.get("exp"), raw.get("nbf")
        if not _number(exp) or now >= exp:
            return refusal.unauthenticated("the token has expired")
        if nbf is not None and (not _number(nbf) or now < nbf):
            return refusal.unauthenticated("the token is not valid yet")
        try:
            agent = _name(raw, c.agent_claim)
            tenant = _name(raw, c.tenant_claim) if c.tenant_claim else "default"
            version = _name(raw, c.version_claim) if c.version_claim else "0"
        except ValueError as exc:
            return refusal.unauthenticated(str(exc))
        return Identity(agent, tenant, version, refuse_at=c.refuse_at, issuer=c.iss)


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _name(raw: Mapping[str, Any], claim: str) -> str:
    """A claim naming the agent, tenant or version: printable text a stop's scope can name."""
    value = raw.get(claim)
    if (
        not isinstance(value, str)
        or not value
        or value != value.strip()
        or len(value) > MAX_NAME_CHARS
        or has_control_characters(value)
    ):
        raise ValueError(
            f"the token's {claim!r} claim is not a name (printable text, 1 to {MAX_NAME_CHARS} characters)"
        )
    return value
