"""Verifying the broker's run credentials in a downstream system (stop level 4).

A credential is a JWT the control plane's broker signed with EdDSA for one audience (see
``haltwire.control.broker``). ``CredentialVerifier.verify`` accepts one only when:

1. its ``kid`` names a key of the broker's JWKS (fetched at start; refetched when an unknown
   kid turns up, at most once per ``jwks_refresh_s``, so a rotated-in key is learned without
   letting garbage tokens hammer the control plane), and the signature holds;
2. its issuer is ``haltwire`` and its audience is this service's;
3. it has not expired by *this* process's clock (no leeway);
4. it is not revoked. Every stop is a revocation: the verifier follows the control plane's
   watch stream (``haltwire.watch.StopWatch``, as the gateway does) and denies a credential when an active
   stop matches one of its run's scopes, or when a stop on one of them was issued after the
   credential's ``gen`` (``StopSet.fence``), so it stays dead after the stop is cleared;
5. the watch is fresh: having heard nothing for ``staleness_s``, the verifier denies every
   credential (fail closed), as the gateway does.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx2
import jwt

from haltwire.config import ControlLink
from haltwire.scope import Scope, run_scopes
from haltwire.stops import Stopped, StopSet
from haltwire.watch import VERIFIER, StopWatch

ISSUER: Final = "haltwire"
ALGORITHM: Final = "EdDSA"
JWKS_PATH: Final = "/.well-known/jwks.json"
_REQUIRED: Final = ["iss", "aud", "sub", "run", "agent", "tenant", "ver", "gen", "iat", "exp", "jti"]


class CredentialRefused(Exception):
    """A credential to refuse. ``code``: ``credential_invalid`` (forged, tampered, wrong
    audience, unknown key), ``credential_expired``, ``credential_revoked`` (a stop), or
    ``registry_unreachable`` (the verifier cannot tell: retryable)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.code == "registry_unreachable"


def _invalid(message: str) -> CredentialRefused:
    return CredentialRefused("credential_invalid", message)


@dataclass(frozen=True, slots=True)
class CredentialClaims:
    jti: str
    run: str
    agent: str
    tenant: str
    version: str
    audience: str
    generation: int
    issued_at: float
    expires_at: float
    kid: str

    @property
    def scopes(self) -> frozenset[Scope]:
        """The scopes whose stops revoke this credential: its run's (never a tool's)."""
        return run_scopes(self.run, self.agent, self.tenant, self.version)


class JwksKeys:
    """The broker's public keys, from its JWKS URL."""

    def __init__(
        self,
        url: str,
        *,
        refresh_s: float = 30.0,
        timeout_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._keys: dict[str, Any] = {}
        self._fetched_at = -math.inf
        self._lock = anyio.Lock()
        #: How many times the JWKS was fetched (tests and metrics).
        self.fetches = 0

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def load(self, jwks: Mapping[str, Any]) -> None:
        """Replace the keys with the EdDSA keys of ``jwks`` (others are ignored)."""
        keys: dict[str, Any] = {}
        for jwk in jwks.get("keys", []):
            if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                continue
            kid = jwk.get("kid")
            if not isinstance(kid, str) or jwk.get("alg", ALGORITHM) != ALGORITHM:
                continue
            try:
                keys[kid] = jwt.PyJWK({**jwk, "alg": ALGORITHM}).key
            except jwt.PyJWTError:
                continue
        self._keys = keys

    async def fetch(self) -> None:
        """Fetch the JWKS now; raises ``httpx2.HTTPError`` or ``ValueError`` when it cannot."""
        async with httpx2.AsyncClient(timeout=self._timeout_s) as http:
            r = await http.get(self.url)
            r.raise_for_status()
            body = r.json()
        if not isinstance(body, dict):
            raise ValueError(f"{self.url} did not answer a JWKS object")
        self.load(body)
        self.fetches += 1
        self._fetched_at = self._monotonic()

    async def key(self, kid: str) -> Any | None:
        """The key for ``kid``; an unknown kid refetches the JWKS, at most once per ``refresh_s``."""
        key = self._keys.get(kid)
        if key is not None:
            return key
        async with self._lock:
            if kid not in self._keys and self._monotonic() - self._fetched_at >= self.refresh_s:
                try:
                    await self.fetch()
                except (httpx2.HTTPError, ValueError):
                    self._fetched_at = self._monotonic()  # failing counts too: no retry storm
        return self._keys.get(kid)


class CredentialVerifier:
    """Verifies credentials for one ``audience``: JWKS keys, its own clock, and a stop watch.

    Build it with ``CredentialVerifier.connect(...)`` and run it with ``async with
    verifier.running():`` (it fetches the JWKS and replays the stops before it returns), or
    give it the keys and a ``StopWatch`` already running (the gateway does).
    """

    def __init__(
        self,
        keys: JwksKeys,
        audience: str,
        watch: StopWatch,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.audience = audience
        self.watch = watch
        self._clock = clock

    @classmethod
    def connect(
        cls,
        control_url: str,
        token: str,
        audience: str,
        *,
        jwks_url: str | None = None,
        staleness_s: float = 15.0,
        connect_timeout_s: float = 15.0,
        jwks_refresh_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> CredentialVerifier:
        """A verifier for ``control_url``; ``token`` is a control-plane identity allowed to watch
        every stop (role viewer, gateway or executor)."""
        base = control_url.rstrip("/")
        link = ControlLink(
            url=base, token=token, staleness_s=staleness_s, connect_timeout_s=connect_timeout_s
        )
        keys = JwksKeys(jwks_url or base + JWKS_PATH, refresh_s=jwks_refresh_s, monotonic=monotonic)
        watch = StopWatch(link, monotonic=monotonic, clock=clock, point=VERIFIER)
        return cls(keys, audience, watch, clock=clock)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[CredentialVerifier]:
        """Fetch the keys and follow the watch until the block exits."""
        await self.keys.fetch()
        async with anyio.create_task_group() as tg:
            await self.watch.start(tg)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()

    async def verify(self, token: str) -> CredentialClaims:
        """The credential's claims; raises ``CredentialRefused`` when it must be refused."""
        claims = await self.authentic(token)
        if self._clock() >= claims.expires_at:
            raise CredentialRefused("credential_expired", f"the credential for run {claims.run} has expired")
        self.check_revoked(claims)
        return claims

    async def authentic(self, token: str) -> CredentialClaims:
        """Signature, key, issuer and audience only (no clock, no stops)."""
        return await authenticate(self.keys, token, self.audience)

    def check_revoked(self, claims: CredentialClaims) -> None:
        """Raises unless the watch is fresh and no stop revokes the credential."""
        if not self.watch.current():
            staleness_s = self.watch.link.staleness_s
            raise CredentialRefused(
                "registry_unreachable",
                f"nothing heard from the stop registry for over {staleness_s:g} s; no credential is accepted",
            )
        message = revoked(claims, self.watch.stops, self._clock())
        if message is not None:
            raise CredentialRefused("credential_revoked", message)


async def authenticate(keys: JwksKeys, token: str, audience: str) -> CredentialClaims:
    """The claims of ``token`` if a key of ``keys`` signed it for ``audience`` (no clock, no stops)."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise _invalid(f"the credential cannot be read: {exc}") from None
    kid, alg = header.get("kid"), header.get("alg")
    if alg != ALGORITHM or not isinstance(kid, str):
        raise _invalid(f"the credential must be signed with {ALGORITHM} and name its key")
    key = await keys.key(kid)
    if key is None:
        raise _invalid(f"the credential is signed with an unknown key id {kid!r}")
    try:
        raw = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            audience=audience,
            issuer=ISSUER,
            # Expiry is the caller's to judge, with its own clock and no leeway.
            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False, "require": _REQUIRED},
        )
        return CredentialClaims(
            jti=_text(raw, "jti"),
            run=_text(raw, "run"),
            agent=_text(raw, "agent"),
            tenant=_text(raw, "tenant"),
            version=_text(raw, "ver"),
            audience=audience,
            generation=_generation(raw),
            issued_at=_number(raw, "iat"),
            expires_at=_number(raw, "exp"),
            kid=kid,
        )
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        raise _invalid(f"the credential is not valid: {exc}") from None


def revoked(claims: CredentialClaims, stops: StopSet, now: float) -> str | None:
    """Why a stop revokes ``claims`` (active on its run's scopes, or issued after it), or None."""
    verdict = stops.verdict(lambda: claims.scopes, now, claims.generation)
    if verdict is None:
        return None
    if isinstance(verdict, Stopped):
        return f"work in scope {verdict.scope} was stopped ({verdict.stop.reason}; stop {verdict.stop.stop_id})"
    return f"issued before stop revision {verdict.revision} on its run's scopes; the run must get a new credential"


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise ValueError(f"the {key!r} claim is not a non-empty string")
    return value


def _generation(raw: Mapping[str, Any]) -> int:
    value = raw["gen"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("the 'gen' claim is not a non-negative integer")
    return value


def _number(raw: Mapping[str, Any], key: str) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the {key!r} claim is not a number")
    return float(value)
