"""Issuing a run credential (stop level 4), reading a run's credential map, and the broker's keys.

A run's owning agent asks for one configured audience; the broker (``haltwire.control.broker``)
refuses once a stop covers the run, as a lease renewal is refused. The credential is written
to the map before it is handed out: one the map does not list never leaves (fail closed).
A refusal by a stop is audited once per run and stop; the run keeps asking until it notices.
"""

from __future__ import annotations

from haltwire.control.broker import Broker, Jwks
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid
from haltwire.control.plane import Plane
from haltwire.control.runs import run_for
from haltwire.store.credentials import CredentialRecord


def broker(plane: Plane) -> Broker:
    """The broker; ``Refused`` 501 when the control plane has no ``[broker]``."""
    if plane.broker is None:
        raise Refused(501, "broker_not_configured", "this control plane has no [broker]")
    return plane.broker


def published_keys(plane: Plane) -> Jwks:
    """The broker's public keys; ``Refused`` 404 when the control plane has no ``[broker]``: it
    publishes none, and a feature that is off is not a server error."""
    if plane.broker is None:
        raise Refused(
            404, "broker_not_configured", "this control plane has no [broker]: it publishes no keys"
        )
    return plane.broker.keys.jwks()


async def issue(plane: Plane, caller: Caller, run_id: str, audience: str) -> tuple[str, CredentialRecord]:
    """A signed credential for one of the caller's runs, and its map entry."""
    issuer = broker(plane)
    run = await run_for(plane, caller, run_id, "credential.issue", audit=True)
    if audience not in issuer.audiences:
        known = ", ".join(sorted(issuer.audiences))
        problem = invalid(f"unknown audience {audience!r}; known: {known}")
        raise await plane.refuse(caller, "credential.issue", run_id, problem)
    await plane.catch_up()
    issued = issuer.issue(run, audience)
    if isinstance(issued, Refused):
        if issuer.first_refusal(run_id, issued):
            detail = {"code": issued.code}
            if "stop_id" in issued.extra:
                detail["stop_id"] = str(issued.extra["stop_id"])
            await plane.audit(caller, "credential.issue", run_id, "refused", issued.message, **detail)
        raise issued
    token, record = issued
    async with plane.transaction():
        await plane.open.credentials.record(record)
        await plane.audit(
            caller,
            "credential.issue",
            run_id,
            "ok",
            "issued",
            jti=record.jti,
            audience=record.audience,
            kid=record.kid,
            expires_at=record.expires_at,
        )
    return token, record


async def listed(plane: Plane, caller: Caller, run_id: str) -> list[CredentialRecord]:
    """The credential map of one run the caller may read."""
    await run_for(plane, caller, run_id, "credentials.read", audit=False)
    return await plane.open.credentials.for_run(run_id)
