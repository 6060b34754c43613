"""A local identity provider for tests: a real HTTP server publishing a JWKS, and JWTs signed with
real keys (RSA, EC P-256, Ed25519, from ``cryptography``), as an OAuth authorization server issues
agent identities; plus the forgeries a hostile caller would try."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.serve import serving

KeyKind = Literal["rsa", "ec", "ed25519"]
ALGORITHM: dict[KeyKind, str] = {"rsa": "RS256", "ec": "ES256", "ed25519": "EdDSA"}
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey

ISS = "https://idp.example.test"
AUDIENCE = "https://gateway.example.test/mcp"
#: The claims this provider names its agents with (configured in the gateway's ``[issuer]``).
#: ``[issuer] refresh_s`` in tests: an unknown key id, or a failed fetch, refetches this often at most.
REFRESH_S = 0.5
CLAIMS = {"agent_claim": "agent_id", "tenant_claim": "org", "version_claim": "agent_version"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class LocalIssuer:
    """Keys by kid (``add_key``; ``published`` says which the JWKS lists) and a JWKS endpoint at
    ``/jwks.json`` that counts its fetches and, while ``failing``, answers 503."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[KeyKind, PrivateKey]] = {}
        self.published: list[str] = []
        self.fetches = 0
        self.failing = False

    def add_key(self, kid: str, kind: KeyKind = "ec", *, publish: bool = True) -> None:
        key: PrivateKey
        if kind == "rsa":
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif kind == "ec":
            key = ec.generate_private_key(ec.SECP256R1())
        else:
            key = ed25519.Ed25519PrivateKey.generate()
        self.keys[kid] = (kind, key)
        if publish:
            self.published.append(kid)

    def jwks(self) -> dict[str, Any]:
        out = []
        for kid in self.published:
            kind, key = self.keys[kid]
            public = key.public_key()
            if isinstance(public, rsa.RSAPublicKey):
                jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
            elif isinstance(public, ec.EllipticCurvePublicKey):
                jwk = ECAlgorithm.to_jwk(public, as_dict=True)
            else:
                jwk = OKPAlgorithm.to_jwk(public, as_dict=True)
            out.append({**jwk, "kid": kid, "use": "sig", "alg": ALGORITHM[kind]})
        return {"keys": out}

    def claims(self, agent: str, version: str, tenant: str = "acme", ttl_s: float = 300.0) -> dict[str, Any]:
        now = int(time.time())
        return {
            "iss": ISS,
            "aud": AUDIENCE,
            "sub": f"client-{agent}",
            "agent_id": agent,
            "org": tenant,
            "agent_version": version,
            "iat": now,
            "exp": now + int(ttl_s),
            "jti": uuid.uuid4().hex,
        }

    def sign(self, claims: dict[str, Any], kid: str | None = None) -> str:
        """``claims`` signed with key ``kid`` (the first key by default), naming it in the header."""
        kid = kid or next(iter(self.keys))
        kind, key = self.keys[kid]
        return jwt.encode(claims, key, algorithm=ALGORITHM[kind], headers={"kid": kid})

    def token(self, agent: str, version: str, tenant: str = "acme", kid: str | None = None) -> str:
        return self.sign(self.claims(agent, version, tenant), kid)

    def public_pem(self, kid: str) -> bytes:
        return (
            self.keys[kid][1]
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    def app(self) -> Starlette:
        async def jwks(request: Request) -> Response:
            self.fetches += 1
            if self.failing:
                return JSONResponse({"error": "unavailable"}, status_code=503)
            return JSONResponse(self.jwks())

        return Starlette(routes=[Route("/jwks.json", jwks)])


def unsigned(claims: dict[str, Any], kid: str) -> str:
    """``alg: none``: a token with no signature at all."""
    header = {"alg": "none", "typ": "JWT", "kid": kid}
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


def hmac_with(secret: bytes, claims: dict[str, Any], kid: str) -> str:
    """HS256 with ``secret`` (the issuer's public key, say): written by hand, because PyJWT refuses
    to sign HMAC with a key that looks public, which is the forgery this is."""
    header = {"alg": "HS256", "typ": "JWT", "kid": kid}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def tampered(token: str, **changes: Any) -> str:
    """``token`` with its payload changed and its signature kept."""
    head, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"{head}.{_b64(json.dumps({**claims, **changes}).encode())}.{signature}"


@asynccontextmanager
async def publishing(issuer: LocalIssuer, port: int = 0) -> AsyncIterator[str]:
    """The issuer's JWKS served on ``port``; yields its URL."""
    async with serving(issuer.app(), port=port) as url:
        yield f"{url}/jwks.json"


def issuer_section(jwks_url: str, **keys: Any) -> dict[str, Any]:
    """A gateway's ``[issuer]`` for this provider (short refresh periods, for tests)."""
    return {
        "iss": ISS,
        "jwks_url": jwks_url,
        "audience": AUDIENCE,
        **CLAIMS,
        "refresh_s": REFRESH_S,
        **keys,
    }
