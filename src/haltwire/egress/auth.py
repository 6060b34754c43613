"""Who is calling the egress proxy: the run's lease token, or a broker credential of the run, in
``Proxy-Authorization`` (rules only).

``Basic`` with the token as the password (the user is not read: the run id by convention, so
that ``HTTPS_PROXY=http://RUN:TOKEN@HOST:PORT`` works in curl, requests, httpx and aiohttp), or
``Bearer TOKEN``. In this order:

1. no header, or one of another scheme or that does not decode: ``proxy_auth_required``;
2. the token's signature (the proxy's own lease keys) and expiry (the proxy's own clock):
   ``haltwire.leasecheck.token_claims``, as the gateway checks a lease. With ``[broker]`` in
   the proxy's config, a token signed as the broker signs its credentials (EdDSA, where a lease
   is HS256) is checked instead as the gateway checks one (``haltwire.leasecheck.credential_claims``:
   the broker's JWKS, the issuer, the audience ``[broker] audience``, the expiry); it then stands
   for its run's lease, so stops on the run's scopes and its generation (fencing) apply alike.

Both are answered 407 with ``Proxy-Authenticate`` by the proxy: the credentials do not
authenticate a run. A token that authenticates but whose run is stopped or fenced is the
proxy's next check, answered 403.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Final

import jwt

from haltwire import refusal
from haltwire.credentials import ALGORITHM as CREDENTIAL_ALGORITHM
from haltwire.credentials import JwksKeys
from haltwire.leasecheck import credential_claims, token_claims
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims, LeaseKeys

#: Sent with every 407.
CHALLENGE: Final = 'Basic realm="haltwire egress", charset="UTF-8"'
#: Longer credentials are not read (a lease token is well under 1 KiB).
MAX_CREDENTIALS: Final = 8192


def presented_token(header: str | None) -> str | Refusal:
    """Step 1: the token a ``Proxy-Authorization`` value carries, or its refusal."""
    if header is None:
        return refusal.proxy_auth_required("no Proxy-Authorization header")
    if len(header) > MAX_CREDENTIALS:
        return refusal.proxy_auth_required("the Proxy-Authorization header is too long")
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() != "basic" or not value:
        return refusal.proxy_auth_required("Proxy-Authorization is neither Basic nor Bearer")
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return refusal.proxy_auth_required("Proxy-Authorization Basic does not decode")
    _, colon, password = decoded.partition(":")
    if not colon or not password:
        return refusal.proxy_auth_required("Proxy-Authorization Basic has no password (the lease token)")
    return password


@dataclass(frozen=True, slots=True)
class Broker:
    """The broker whose credentials the proxy accepts: its keys, and the audience they must name."""

    keys: JwksKeys
    audience: str


def _is_credential(token: str) -> bool:
    """Signed as the broker signs (a lease token is HS256): the header alone, nothing verified."""
    try:
        return bool(jwt.get_unverified_header(token).get("alg") == CREDENTIAL_ALGORITHM)
    except jwt.PyJWTError:
        return False


async def caller(
    keys: LeaseKeys, header: str | None, now: float, broker: Broker | None = None
) -> LeaseClaims | Refusal:
    """Steps 1 and 2: the claims of the run calling, or the refusal to answer with 407."""
    token = presented_token(header)
    if isinstance(token, Refusal):
        return token
    if broker is not None and _is_credential(token):
        return await credential_claims(broker.keys, token, broker.audience, now)
    return token_claims(keys, token, now)
