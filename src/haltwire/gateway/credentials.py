"""Run credentials from the control plane's broker, accepted as bearer tokens at the gateway's edge.

With ``[broker]`` in its config, a gateway that meets a bearer token not in its token table
but shaped like a JWT verifies it with the broker's JWKS (``haltwire.credentials``): its
signature, issuer, audience and expiry by the gateway's own clock. The identity is the
configured identity whose agent id, tenant and version are the credential's (none: 401).
The credential then stands for a lease: its run becomes the call's run, so stops on the run
and its scopes, the fencing generation (``gen``) and the run's step budget apply to it in
the pipeline (``haltwire.gateway.proxy``), as they do for a lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from haltwire import refusal
from haltwire.credentials import JwksKeys
from haltwire.identity import Identity
from haltwire.leasecheck import credential_claims
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims

#: Where the edge leaves a verified credential's claims for the pipeline (ASGI scope state).
CREDENTIAL_STATE_KEY: Final = "haltwire.credential"


def jwt_shaped(token: str) -> bool:
    """Three base64url parts, the first a JSON object (``eyJ`` is ``{"``)."""
    return token.count(".") == 2 and token.startswith("eyJ")


class CredentialEdge:
    """Resolves a broker credential to a configured identity and the run it carries."""

    def __init__(
        self,
        keys: JwksKeys,
        audience: str,
        identities: Iterable[Identity],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.audience = audience
        self._by_key = {i.key: i for i in identities}
        self._clock = clock

    async def resolve(self, token: str) -> tuple[Identity, LeaseClaims] | Refusal:
        lease = await credential_claims(self.keys, token, self.audience, self._clock())
        if isinstance(lease, Refusal):
            return lease
        identity = self._by_key.get((lease.agent, lease.tenant, lease.version))
        if identity is None:
            return refusal.unauthenticated(
                f"no identity here is agent {lease.agent} of that tenant and version"
            )
        return identity, lease
