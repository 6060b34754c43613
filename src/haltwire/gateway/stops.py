"""The gateway's stop check (level 3 of the stop ladder): is this call stopped, and is its lease fenced?

In this order, before anything is routed or counted:

1. the watch must be current (heard from within ``staleness_s``): else ``registry_unreachable``,
   for every call, since a gateway that cannot hear stops must not serve;
2. ``StopSet.verdict`` for the call's scopes (agent, tenant, version, tool, global, and its run
   when a lease or credential names one) and the grant's generation: an active stop is
   ``stopped``; a stop on the run's scopes since the grant is ``lease_invalid`` (the run must
   get a new lease or credential, even once the stop is cleared).
"""

from __future__ import annotations

from haltwire import refusal
from haltwire.identity import Identity
from haltwire.refusal import Refusal
from haltwire.scope import call_scopes
from haltwire.stops import Stopped
from haltwire.tokens import LeaseClaims
from haltwire.watch import StopWatch


def stop_refusal(watch: StopWatch, identity: Identity, tool: str, lease: LeaseClaims | None) -> Refusal | None:
    """The refusal for this call, or None (see the module's docstring)."""
    if not watch.current():
        return refusal.registry_unreachable(watch.link.staleness_s)
    return verdict_refusal(watch, identity, tool, lease)


def verdict_refusal(
    watch: StopWatch, identity: Identity, tool: str, lease: LeaseClaims | None
) -> Refusal | None:
    """Step 2 alone: whether the stops held stop this call (a call in flight is judged by it too)."""
    run = lease.run if lease is not None else None
    generation = lease.generation if lease is not None else None
    verdict = watch.stops.verdict(lambda: call_scopes(identity, tool, run), watch.clock(), generation)
    if verdict is None:
        return None
    if isinstance(verdict, Stopped):
        return refusal.stopped(str(verdict.scope), verdict.stop.stop_id, verdict.stop.reason)
    return refusal.lease_invalid(
        f"granted before stop revision {verdict.revision} on this run; the run must get a new lease or credential"
    )
