"""The checks every enforcement point makes of a run's lease token, written once.

The gateway (``haltwire.gateway.leases``, ``haltwire.gateway.stops``) and the egress proxy
(``haltwire.egress``) both call these; each maps the answer to its own wire:

1. ``token_claims``: the token's signature, with the point's own keys, then its expiry, by the
   point's own clock and with no leeway. The signature is checked first and without a clock,
   so that the refusal of an authentic but expired lease can name its run.
   A broker credential (``haltwire.credentials``) stands for a lease: ``credential_claims``
   checks it with the broker's JWKS for the point's audience, then its expiry the same way,
   and answers the lease claims it carries (its run, agent, tenant, version and generation).
2. ``run_refusal``: the watch must be current (heard from within ``staleness_s``), else
   ``registry_unreachable`` (fail closed); then ``StopSet.verdict`` on the run's scopes (run,
   agent, tenant, version, global; never a tool's or a model's) and the grant's generation: an active stop
   is ``stopped``, a stop on them issued after the grant is ``lease_invalid`` (fenced), even
   once cleared.
"""

from __future__ import annotations

import math

from haltwire import refusal
from haltwire.credentials import CredentialRefused, JwksKeys, authenticate
from haltwire.refusal import Refusal
from haltwire.scope import run_scopes
from haltwire.stops import Stopped, Verdict
from haltwire.tokens import LeaseClaims, LeaseKeys, LeaseTokenError
from haltwire.watch import StopWatch


def token_claims(keys: LeaseKeys, token: str, now: float) -> LeaseClaims | Refusal:
    """Step 1: the claims of an authentic lease unexpired at ``now``, or its refusal."""
    try:
        # Signature only here (no clock can expire it): expiry is judged below, so the
        # refusal can name the run of an authentic but expired lease.
        claims = keys.verify(token, now=-math.inf)
    except LeaseTokenError as exc:
        return refusal.lease_invalid(str(exc))
    except (ValueError, TypeError):
        # Anything a malformed token makes the JWT library raise beyond its own errors.
        return refusal.lease_invalid("the token cannot be read")
    if now >= claims.expires_at:  # no leeway, as LeaseKeys.verify
        return refusal.lease_expired(claims.run)
    return claims


async def credential_claims(keys: JwksKeys, token: str, audience: str, now: float) -> LeaseClaims | Refusal:
    """Step 1 for a broker credential: the lease claims it carries, or ``unauthenticated``."""
    try:
        claims = await authenticate(keys, token, audience)
    except CredentialRefused as exc:
        return refusal.unauthenticated(exc.message)
    if now >= claims.expires_at:  # no leeway, as for leases
        return refusal.unauthenticated(f"the credential for run {claims.run} has expired")
    return LeaseClaims(
        run=claims.run,
        agent=claims.agent,
        tenant=claims.tenant,
        version=claims.version,
        generation=claims.generation,
        issued_at=claims.issued_at,
        expires_at=claims.expires_at,
    )


def run_refusal(watch: StopWatch, claims: LeaseClaims, point: str = "gateway") -> Refusal | None:
    """Step 2: whether the run of ``claims`` may act at all, whatever it asks; ``point`` names
    the enforcement point in the ``registry_unreachable`` refusal."""
    if not watch.current():
        return refusal.registry_unreachable(watch.link.staleness_s, point=point)
    return run_verdict(watch, claims)


def run_verdict(watch: StopWatch, claims: LeaseClaims) -> Refusal | None:
    """Step 2's verdict alone (a connection already open is judged by it as a stop lands)."""
    c = claims
    verdict = watch.stops.verdict(
        lambda: run_scopes(c.run, c.agent, c.tenant, c.version), watch.clock(), c.generation
    )
    return None if verdict is None else verdict_refusal(verdict)


def verdict_refusal(verdict: Verdict) -> Refusal:
    """The refusal of a ``StopSet.verdict``: ``stopped`` naming the stop, or ``lease_invalid`` (fenced)."""
    if isinstance(verdict, Stopped):
        return refusal.stopped(str(verdict.scope), verdict.stop.stop_id, verdict.stop.reason)
    return refusal.lease_invalid(
        f"granted before stop revision {verdict.revision} on this run; the run must get a new lease or credential"
    )
