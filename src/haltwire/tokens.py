"""Lease tokens: signed, short-lived permission for one run to act.

A lease token is a JWT (HS256, PyJWT) whose header names its key id (``kid``), so keys rotate
without downtime: the control plane signs with one key, and every enforcement point verifies
with any key it still holds. Rotation is: add the new key everywhere, make it the signing
key, and drop the old one once its last tokens have expired (one lease TTL later).

Claims: ``run``, ``agent``, ``tenant``, ``ver`` (the run's identity), ``gen`` (the fencing
generation: the registry revision the grant was checked at; a token older than a stop on
the run is refused even after the stop is cleared), ``iat`` and ``exp`` (Unix seconds).

Expiry is judged here against the verifier's own clock (``now``), never against anything
the caller says, and with no leeway: a lease that has run out is out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt

AUDIENCE: Final = "haltwire-lease"
ALGORITHM: Final = "HS256"
#: HMAC keys shorter than this are refused (RFC 7518 asks for at least the hash size).
MIN_KEY_BYTES: Final = 32
_CACHE_SIZE: Final = 65_536
_REQUIRED: Final = ["run", "agent", "tenant", "ver", "gen", "iat", "exp", "aud"]


class LeaseTokenError(Exception):
    """A lease token that must be refused. ``code`` is the refusal code."""

    code = "lease_invalid"


class LeaseInvalid(LeaseTokenError):
    """Forged, tampered, unreadable, signed with an unknown key, or for the wrong run."""


class LeaseExpired(LeaseTokenError):
    code = "lease_expired"


@dataclass(frozen=True, slots=True)
class LeaseClaims:
    run: str
    agent: str
    tenant: str
    version: str
    generation: int
    issued_at: float
    expires_at: float

    def payload(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "agent": self.agent,
            "tenant": self.tenant,
            "ver": self.version,
            "gen": self.generation,
            "iat": self.issued_at,
            "exp": self.expires_at,
            "aud": AUDIENCE,
        }


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease as the control plane answers a registration or a renewal, and as the runtime
    reads it: the token and the timing the runtime must keep."""

    run_id: str
    token: str
    expires_at: float
    ttl_s: float
    renew_every_s: float
    renew_timeout_s: float
    generation: int

    def json(self) -> dict[str, Any]:
        # Spelled out: dataclasses.asdict deep-copies, and a batch answers up to 1000 of these.
        return {
            "run_id": self.run_id,
            "token": self.token,
            "expires_at": self.expires_at,
            "ttl_s": self.ttl_s,
            "renew_every_s": self.renew_every_s,
            "renew_timeout_s": self.renew_timeout_s,
            "generation": self.generation,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Grant:
        return cls(
            run_id=str(data["run_id"]),
            token=str(data["token"]),
            expires_at=float(data["expires_at"]),
            ttl_s=float(data["ttl_s"]),
            renew_every_s=float(data["renew_every_s"]),
            renew_timeout_s=float(data["renew_timeout_s"]),
            generation=int(data["generation"]),
        )


class LeaseKeys:
    """The keys that verify lease tokens, and (on the control plane) the one that signs.

    ``keys`` maps key id to secret. ``signing`` names the signing key; None on a verifier.
    """

    def __init__(self, keys: Mapping[str, bytes], signing: str | None = None) -> None:
        if not keys:
            raise ValueError("lease tokens need at least one key")
        for kid, secret in keys.items():
            if len(secret) < MIN_KEY_BYTES:
                raise ValueError(
                    f"lease key {kid!r} is {len(secret)} bytes; it needs {MIN_KEY_BYTES} or more"
                )
        if signing is not None and signing not in keys:
            raise ValueError(f"the signing key {signing!r} is not among the lease keys")
        self._keys = dict(keys)
        self.signing = signing
        # Token text -> claims. A runtime sends the same token on every call until it
        # renews, so the signature is checked once per token; expiry is still checked
        # on every call. Bounded: cleared when full.
        self._verified: dict[str, LeaseClaims] = {}

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def sign(self, claims: LeaseClaims) -> str:
        if self.signing is None:
            raise ValueError("these lease keys only verify; no signing key is set")
        return jwt.encode(
            claims.payload(), self._keys[self.signing], algorithm=ALGORITHM, headers={"kid": self.signing}
        )

    def verify(self, token: str, *, now: float) -> LeaseClaims:
        """The token's claims if its signature holds and it has not expired at ``now``."""
        claims = self._verified.get(token)
        if claims is None:
            claims = self._check_signature(token)
            if len(self._verified) >= _CACHE_SIZE:
                self._verified.clear()
            self._verified[token] = claims
        if now >= claims.expires_at:
            raise LeaseExpired(f"the lease for run {claims.run} expired")
        return claims

    def _check_signature(self, token: str) -> LeaseClaims:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            secret = self._keys.get(kid) if isinstance(kid, str) else None
            if secret is None:
                raise LeaseInvalid(f"the lease token is signed with an unknown key id {kid!r}")
            raw = jwt.decode(
                token,
                secret,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                # Expiry is ours to judge, below, with the verifier's clock and no leeway.
                options={"verify_exp": False, "verify_iat": False, "require": _REQUIRED},
            )
            claims = LeaseClaims(
                run=_text(raw, "run"),
                agent=_text(raw, "agent"),
                tenant=_text(raw, "tenant"),
                version=_text(raw, "ver"),
                generation=_int(raw, "gen"),
                issued_at=_number(raw, "iat"),
                expires_at=_number(raw, "exp"),
            )
        except jwt.PyJWTError as exc:
            raise LeaseInvalid(f"the lease token is not valid: {exc}") from None
        return claims


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise LeaseInvalid(f"the lease token's {key!r} claim is not a non-empty string")
    return value


def _int(raw: Mapping[str, Any], key: str) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LeaseInvalid(f"the lease token's {key!r} claim is not a non-negative integer")
    return value


def _number(raw: Mapping[str, Any], key: str) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LeaseInvalid(f"the lease token's {key!r} claim is not a number")
    return float(value)
