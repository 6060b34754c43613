"""The gateway's lease check (level 3 of the stop ladder): policy only.

A call may carry a lease token, in ``params._meta["io.haltwire/lease"]`` or else in the
``Haltwire-Lease`` HTTP header. The gateway verifies it with its own keys and by its own
clock (never the runtime's), binds it to the calling identity, and from then on knows the
call's run: stops on ``run:ID`` apply, the fencing generation is checked against the stops
this gateway follows, and the run's step budget counts it.

A call without a token has no run, so nothing of a run (its stops, its fence, its step budget,
its intent limits) could apply to it: it is refused ``lease_invalid``, unless its identity is in
``optional`` (its config says ``lease = "optional"``, the explicit opt-out), and then served in
no run. The list names the exceptions, not the rule, so an identity the gateway learns of
elsewhere than its config table must present a lease too (fail closed). Every refusal here is
terminal: a runtime whose lease is gone must stop, not retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from haltwire import refusal
from haltwire.identity import Identity, IdentityKey
from haltwire.leasecheck import token_claims
from haltwire.meta import LEASE_META, RUN_META
from haltwire.refusal import Refusal
from haltwire.tokens import LeaseClaims, LeaseKeys

_MAX_SCOPE_CACHE: Final = 65_536


def without_lease(meta: dict[str, Any]) -> dict[str, Any] | None:
    """``meta`` minus the lease token: it is a credential for this gateway, not for upstreams."""
    rest = {k: v for k, v in meta.items() if k != LEASE_META}
    return rest or None


class LeaseCheck:
    """Verifies the lease of one call. ``optional``: the identities (``Identity.key``) that may call without one."""

    def __init__(
        self,
        keys: LeaseKeys,
        optional: Collection[IdentityKey] = (),
        *,
        clock: Callable[[], float] = time.time,
        issued_optional: bool = False,
    ) -> None:
        self.keys = keys
        self.optional = frozenset(optional)
        #: Whether identities from the ``[issuer]`` may call without one (``[issuer] lease``).
        self.issued_optional = issued_optional
        self._clock = clock

    def check(
        self, identity: Identity, meta: Mapping[str, Any] | None, header: str | None
    ) -> LeaseClaims | Refusal | None:
        """The lease's claims, the refusal for this call, or None (no lease, and none needed)."""
        token: object = None
        claimed_run: object = None
        if meta:
            token = meta.get(LEASE_META)
            claimed_run = meta.get(RUN_META)
        if token is None:
            token = header
        if token is None:
            optional = self.issued_optional if identity.issuer is not None else identity.key in self.optional
            if not optional:
                return refusal.lease_missing(identity.agent)
            return None
        if not isinstance(token, str) or not token:
            return refusal.lease_invalid("the lease token is empty or not a string")
        claims = token_claims(self.keys, token, self._clock())
        if isinstance(claims, Refusal):
            return claims
        if (claims.agent, claims.tenant, claims.version) != (
            identity.agent,
            identity.tenant,
            identity.version,
        ):
            return refusal.lease_invalid("issued to another identity")
        if claimed_run is not None and claimed_run != claims.run:
            return refusal.lease_invalid(f"the lease is for run {claims.run}, not the run this call names")
        return claims
