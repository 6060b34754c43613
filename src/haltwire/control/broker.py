"""The credential broker (stop level 4): short-lived, run-scoped credentials for downstream systems.

A run's owning agent asks for a credential for one configured audience (a downstream
system); the broker answers an EdDSA-signed JWT (PyJWT) valid for ``[broker] ttl_s``, and
records it in the credential map. Issue is refused, like a lease renewal, once a stop matches
one of the run's scopes, and "renewal" is only asking again, so a stopped run gets nothing.

Revocation needs no endpoint of its own: every stop on the watch stream *is* one, read as
"deny every credential issued before revision R in scope S". A credential carries ``gen``,
the registry revision its issue was checked at; a verifier that follows the watch denies it
when a stop on one of the run's scopes is active, or when ``StopSet.fence`` of those scopes
is past ``gen`` (so it stays dead after the stop is cleared). ``haltwire.credentials`` is
that verifier. The public keys are served as a JWKS at ``/.well-known/jwks.json``.

Policy only (keys, audiences, lifetime, the stop check); ``haltwire.control.credentials``
is the rule that issues and maps one.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from haltwire.config import ConfigError
from haltwire.control.config import BrokerSection, ControlConfig
from haltwire.control.errors import Refused, stopped_by
from haltwire.control.leases import AuditOnce, ended
from haltwire.control.mirror import StopMirror
from haltwire.credentials import ALGORITHM, ISSUER
from haltwire.stops import Stopped
from haltwire.store.credentials import CredentialRecord
from haltwire.store.runs import RunRecord

log = logging.getLogger("haltwire.broker")


class Jwk(TypedDict):
    """A public key (RFC 8037: an Ed25519 OKP key)."""

    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    x: str
    kid: str
    alg: Literal["EdDSA"]
    use: Literal["sig"]


class Jwks(TypedDict):
    keys: list[Jwk]


class BrokerKeys:
    """The Ed25519 keys credentials are signed with (one) and published for (all)."""

    def __init__(self, private: Mapping[str, Ed25519PrivateKey], signing: str) -> None:
        if signing not in private:
            raise ValueError(f"the signing key {signing!r} is not among the broker keys")
        self._private = dict(private)
        self.signing = signing

    @classmethod
    def from_config(cls, section: BrokerSection) -> BrokerKeys:
        """The section's keys; raises ``ConfigError`` for a missing, unreadable or non-Ed25519 key."""
        if section.generate:
            kid = f"dev-{secrets.token_hex(4)}"
            log.warning(
                "broker: generated an ephemeral signing key %s (development only: its credentials "
                "cannot be verified after this process ends)",
                kid,
            )
            return cls({kid: Ed25519PrivateKey.generate()}, kid)
        private: dict[str, Ed25519PrivateKey] = {}
        for key in section.keys:
            where = f"broker.keys[{key.kid}]"
            if key.private_key_env is not None:
                text = os.environ.get(key.private_key_env)
                if not text:
                    raise ConfigError(f"{where}: the environment variable {key.private_key_env} is not set")
                pem = text.encode()
            else:
                assert key.private_key_file is not None
                try:
                    pem = key.private_key_file.read_bytes()
                except OSError as exc:
                    raise ConfigError(f"{where}: cannot read {key.private_key_file}: {exc}") from None
            try:
                loaded = serialization.load_pem_private_key(pem, password=None)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where}: not a PEM private key: {exc}") from None
            if not isinstance(loaded, Ed25519PrivateKey):
                raise ConfigError(f"{where}: the key is not Ed25519 (EdDSA)")
            private[key.kid] = loaded
        assert section.signing_key is not None  # the config checks it
        return cls(private, section.signing_key)

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._private)

    def jwks(self) -> Jwks:
        """Every public key, as a JWKS (RFC 7517, OKP keys of RFC 8037)."""
        keys: list[Jwk] = []
        for kid, key in sorted(self._private.items()):
            jwk = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
            keys.append(
                {
                    "kty": jwk["kty"],
                    "crv": jwk["crv"],
                    "x": jwk["x"],
                    "kid": kid,
                    "alg": ALGORITHM,
                    "use": "sig",
                }
            )
        return {"keys": keys}

    def sign(self, claims: dict[str, Any]) -> str:
        return jwt.encode(
            claims, self._private[self.signing], algorithm=ALGORITHM, headers={"kid": self.signing}
        )


class Broker:
    """Issues credentials: the keys, the audiences, the lifetime, the stop mirror and the clock."""

    def __init__(
        self,
        keys: BrokerKeys,
        audiences: Sequence[str],
        ttl_s: float,
        mirror: StopMirror | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.audiences = frozenset(audiences)
        self.ttl_s = ttl_s
        self.mirror = mirror if mirror is not None else StopMirror()
        self.clock = clock
        self._noted = AuditOnce()

    @classmethod
    def from_config(cls, config: ControlConfig, mirror: StopMirror | None = None) -> Broker | None:
        """The broker for ``config``; None when it has no ``[broker]`` (the endpoints answer 501)."""
        section = config.broker
        if section is None:
            return None
        return cls(BrokerKeys.from_config(section), section.audiences, section.ttl_s, mirror)

    def issue(self, run: RunRecord, audience: str) -> tuple[str, CredentialRecord] | Refused:
        """A signed credential for ``run`` and its map entry, or why it gets none."""
        stops = self.mirror.stops
        now = self.clock()
        generation = stops.revision  # read before the check: the check covers it
        if run.ended:
            return ended(run, "credentials")
        verdict = stops.verdict(lambda: run.scopes, now)
        if isinstance(verdict, Stopped):  # a new credential has no generation to fence
            return stopped_by(verdict)
        record = CredentialRecord(
            jti="crd_" + secrets.token_hex(16),
            run_id=run.run_id,
            audience=audience,
            kid=self.keys.signing,
            issued_at=now,
            expires_at=now + self.ttl_s,
        )
        claims = {
            "iss": ISSUER,
            "aud": audience,
            "sub": run.run_id,
            "run": run.run_id,
            "agent": run.agent,
            "tenant": run.tenant,
            "ver": run.version,
            "gen": generation,
            "iat": record.issued_at,
            "exp": record.expires_at,
            "jti": record.jti,
        }
        return self.keys.sign(claims), record

    def first_refusal(self, run_id: str, refusal: Refused) -> bool:
        return self._noted.first(run_id, refusal)
