"""Who calls: the bearer token resolved to an identity at the gateway's edge, and nothing else.

A token is, in this order:

1. one of the gateway's own (``[[identities]]``, by its SHA-256): that entry's identity;
2. a JWT from the configured identity provider (``[issuer]``, ``haltwire.gateway.issuer``): the
   identity its claims name;
3. a run credential from the control plane's broker (``[broker]``, ``haltwire.gateway.credentials``):
   the configured identity it names, and the run it carries.

A JWT goes to the broker's verifier when its (unverified) ``iss`` is the broker's and to the
issuer's otherwise; whichever takes it verifies the issuer again, with its own keys. Anything
else is refused ``unauthenticated`` (401).
"""

from __future__ import annotations

import jwt

from haltwire import refusal
from haltwire.credentials import ISSUER as CREDENTIAL_ISSUER
from haltwire.gateway.credentials import CredentialEdge, jwt_shaped
from haltwire.gateway.issuer import IssuerEdge
from haltwire.identity import Identity, TokenTable
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims


class Identities:
    """The edge's resolver: the token table, and JWTs from an issuer or the broker when configured."""

    def __init__(
        self,
        tokens: TokenTable,
        *,
        issuer: IssuerEdge | None = None,
        credentials: CredentialEdge | None = None,
    ) -> None:
        self.tokens = tokens
        self.issuer = issuer
        self.credentials = credentials

    async def resolve(self, token: str) -> tuple[Identity, LeaseClaims | None] | Refusal:
        """The caller's identity and, for a broker credential, its run's claims; or the 401."""
        identity = self.tokens.resolve(token)
        if identity is not None:
            return identity, None
        if jwt_shaped(token):
            if self.credentials is not None and (
                self.issuer is None or _claimed_issuer(token) == CREDENTIAL_ISSUER
            ):
                return await self.credentials.resolve(token)
            if self.issuer is not None:
                issued = await self.issuer.resolve(token)
                return issued if isinstance(issued, Refusal) else (issued, None)
        return refusal.unauthenticated("the bearer token is not recognised")


def _claimed_issuer(token: str) -> object:
    """The ``iss`` a JWT claims, unverified: it only picks the verifier, which checks it."""
    try:
        return jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return None
