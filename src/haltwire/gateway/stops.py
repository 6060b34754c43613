"""The gateway's stop check (level 3 of the stop ladder): is this call stopped, and is its lease fenced?

In this order, before anything is routed or counted:

1. the watch must be current (heard from within ``staleness_s``): else ``registry_unreachable``,
   for every call, since a gateway that cannot hear stops must not serve;
2. ``StopSet.verdict`` for the call's scopes (agent, tenant, version, tool or model, global, and its run
   when a lease or credential names one) and the grant's generation: an active stop is
   ``stopped``; a stop on the run's scopes since the grant is ``lease_invalid`` (the run must
   get a new lease or credential, even once the stop is cleared).

A broker credential is judged at the edge too, on every request whatever its method
(``credential_refusal``): a stopped or fenced credential authenticates nothing, not even a
``tools/list``.
"""

from __future__ import annotations

from haltwire import refusal
from haltwire.identity import Identity
from haltwire.leasecheck import run_refusal
from haltwire.leasecheck import verdict_refusal as _refusal
from haltwire.refusal import Refusal
from haltwire.scope import call_scopes
from haltwire.tokens import LeaseClaims
from haltwire.watch import StopWatch


def stop_refusal(
    watch: StopWatch,
    identity: Identity,
    tool: str | None,
    lease: LeaseClaims | None,
    model: str | None = None,
) -> Refusal | None:
    """The refusal for this call, or None (see the module's docstring). A model call names no
    ``tool`` but the ``model`` it asks for (``scope.call_scopes``)."""
    if not watch.current():
        return refusal.registry_unreachable(watch.link.staleness_s)
    return verdict_refusal(watch, identity, tool, lease, model)


def verdict_refusal(
    watch: StopWatch,
    identity: Identity,
    tool: str | None,
    lease: LeaseClaims | None,
    model: str | None = None,
) -> Refusal | None:
    """Step 2 alone: whether the stops held stop this call (a call in flight is judged by it too)."""
    run = lease.run if lease is not None else None
    generation = lease.generation if lease is not None else None
    verdict = watch.stops.verdict(lambda: call_scopes(identity, tool, run, model), watch.clock(), generation)
    return None if verdict is None else _refusal(verdict)


def credential_refusal(watch: StopWatch, credential: LeaseClaims) -> Refusal | None:
    """Whether a broker credential may authenticate a request at all, whatever it asks: not while
    the watch is stale (a stop on its run could not be known), nor while a stop matches its run's
    scopes (run, agent, tenant, version, global; a tool stop refuses calls to the tool, it revokes
    no credential), nor ever again once a stop on them came after its grant (fenced). The rule is
    ``haltwire.leasecheck.run_refusal``, which the egress proxy applies to a lease too."""
    return run_refusal(watch, credential)
