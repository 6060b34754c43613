"""Runs and their leases: register a run, renew its lease, end it, checkpoint it.

A run is its registering identity's, its agent id in its tenant (``access.ownership``): only
that agent renews, ends (an operator may too), checkpoints and resumes from it, in any version.
Another tenant's run is answered as an unknown one (404 ``unknown_run``), its refusal audited
with what it was; another agent's in the caller's tenant is 403 ``forbidden``.

Every registration, end and checkpoint is audited in its own write's transaction, refused ones
too; a refused renewal is audited once per run and reason (a refused runtime keeps renewing
every few seconds until it notices), runs refused by one stop in one request sharing a record;
successful renewals are not audited (one per run every few seconds). Whether a run may have a
lease, and the signed grant, is the lease desk's (``haltwire.control.leases``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Final

import anyio

from haltwire.control.access import ownership
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid
from haltwire.control.leases import LeaseDesk
from haltwire.control.plane import Plane
from haltwire.control.wall_clock import check_renewal
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.runs import Checkpoint, RunExists, RunRecord, UnknownRun, new_run_id
from haltwire.tokens import Grant


@dataclass(frozen=True, slots=True)
class Registration:
    """A run just registered: the run, its first lease, and the checkpoint it resumes from."""

    run: RunRecord
    lease: Grant
    checkpoint: Checkpoint | None


def desk(plane: Plane) -> LeaseDesk:
    """The lease desk; ``Refused`` 501 when the control plane has no ``[leases]``."""
    if plane.leases is None:
        raise Refused(501, "leases_not_configured", "this control plane has no [leases] keys")
    return plane.leases


def _refusal(caller: Caller, run: RunRecord, action: str) -> tuple[Refused, str] | None:
    """None when ``caller`` may take ``action`` on ``run``; else the answer and what to audit."""
    # An agent acts on and reads its own runs only; an executor acts on its own, reads any.
    reads_any = caller.role == "executor" and action == "run.read"
    whose = "own" if reads_any else ownership(caller, run.agent, run.tenant)
    if whose == "own":
        return None
    if whose == "another_tenant":  # answered as unknown: no probing other tenants' run ids
        said = f"run {run.run_id} belongs to another tenant than {caller.tenant} (answered unknown_run)"
        return _unknown(run.run_id), said
    problem = Refused(403, "forbidden", f"run {run.run_id} belongs to another agent than {caller.runs_as}")
    return problem, problem.message


def _unknown(run_id: str) -> Refused:
    return Refused(404, "unknown_run", f"no run has the id {run_id}")


async def run_for(plane: Plane, caller: Caller, run_id: str, action: str, audit: bool) -> RunRecord:
    """The run, if it exists and ``caller`` may act on it; refusals are audited when ``audit``."""
    run = await plane.open.runs.get(run_id)
    if run is None:
        problem, said = _unknown(run_id), f"no run has the id {run_id}"
    else:
        refused = _refusal(caller, run, action)
        if refused is None:
            return run
        problem, said = refused
    if audit:
        await plane.audit(caller, action, run_id, "refused", said)
    raise problem


async def register(
    plane: Plane,
    caller: Caller,
    run_id: str | None,
    tools: list[str],
    agent_class: str,
    resume_from: str | None,
) -> Registration:
    """Register a run of the caller's agent and grant its first lease; nothing is recorded for a
    run a stop already covers."""
    leases = desk(plane)
    agent = caller.runs_as
    assert agent is not None  # roles agent (the config requires an agent id) and executor
    stores = plane.open
    run_id = run_id or new_run_id()
    if agent_class not in leases.classes:
        known = ", ".join(sorted(leases.classes))
        problem = invalid(f"unknown agent_class {agent_class!r}; known: {known}")
        raise await plane.refuse(caller, "run.register", run_id, problem)
    checkpoint = None
    if resume_from is not None:
        earlier = await stores.runs.get(resume_from)
        if earlier is None or ownership(caller, earlier.agent, earlier.tenant) != "own":
            problem = invalid(f"resume_from: {resume_from} is not a run of agent {agent} of tenant {caller.tenant}")
            raise await plane.refuse(caller, "run.register", run_id, problem)
        checkpoint = await stores.runs.latest_checkpoint(resume_from)
    run = RunRecord(
        run_id=run_id,
        agent=agent,
        tenant=caller.tenant,
        version=caller.version,
        tools=tuple(tools),
        agent_class=agent_class,
        registered_by=caller.name,
        registered_at=leases.clock(),
        resumed_from=resume_from,
    )
    await leases.catch_up(stores.registry)
    refusal = leases.check(run)
    if refusal is not None:  # nothing is recorded for a run that could not start
        raise await plane.refuse(caller, "run.register", run_id, refusal)
    try:
        async with plane.transaction():
            await stores.runs.register(run)
            grant = leases.grant(run)
            if isinstance(grant, Refused):  # a stop landed between the check and the grant
                raise grant  # the run is not recorded after all
            await plane.audit(
                caller,
                "run.register",
                run_id,
                "ok",
                "registered",
                agent_class=run.agent_class,
                resumed_from=run.resumed_from,
                generation=grant.generation,
            )
    except RunExists as exc:
        raise await plane.refuse(
            caller, "run.register", run_id, Refused(409, "run_exists", str(exc))
        ) from None
    except Refused as exc:
        raise await plane.refuse(caller, "run.register", run_id, exc) from None
    return Registration(run, grant, checkpoint)


async def renew(
    plane: Plane, caller: Caller, run_ids: list[str]
) -> tuple[dict[str, Grant], dict[str, Refused]]:
    """A fresh lease for each run the caller owns that no stop covers, else why not; every run is
    checked at one registry revision."""
    leases = desk(plane)
    await leases.catch_up(plane.open.registry)
    found = await plane.open.runs.get_many(run_ids)
    # A run past its wall-clock bound is stopped here, so its renewal is refused by that stop.
    if await check_renewal(plane, [r for r in found.values() if _refusal(caller, r, "lease.renew") is None]):
        await leases.catch_up(plane.open.registry)
    granted: dict[str, Grant] = {}
    refused: dict[str, Refused] = {}
    audited: dict[str, Refused] = {}  # unknown runs are not: anyone can name any number of ids
    for run_id in dict.fromkeys(run_ids):
        run = found.get(run_id)
        if run is None:
            refused[run_id] = _unknown(run_id)
            continue
        problem = _refusal(caller, run, "lease.renew")
        result = leases.grant(run) if problem is None else problem[0]
        if isinstance(result, Grant):
            granted[run_id] = result
            continue
        refused[run_id] = result
        audited[run_id] = result if problem is None else Refused(result.status, result.code, problem[1])
    await _audit_refusals(plane, leases, caller, audited)
    return granted, refused


async def _audit_refusals(
    plane: Plane, leases: LeaseDesk, caller: Caller, refused: dict[str, Refused]
) -> None:
    """Audit each run's refusal the first time it is refused for that reason.

    Runs refused by one stop share one record (target: the stop's scope, as for the stop's
    own ``stop.issue`` record), so a global stop over thousands of live runs costs a few
    appends per batch, not one per run. ``refused`` holds runs that exist only.
    """
    groups: dict[tuple[str, str], tuple[Refused, list[str]]] = {}
    for run_id, refusal in refused.items():
        if not leases.first_refusal(run_id, refusal):
            continue
        scope = refusal.extra.get("scope")
        key = (refusal.code, str(refusal.extra["stop_id"])) if scope else (refusal.code, run_id)
        groups.setdefault(key, (refusal, []))[1].append(run_id)
    for refusal, runs in groups.values():
        scope = refusal.extra.get("scope")
        target = str(scope) if scope else runs[0]
        detail: dict[str, Any] = {"code": refusal.code}
        if "stop_id" in refusal.extra:
            detail["stop_id"] = refusal.extra["stop_id"]
        await plane.audit(caller, "lease.renew", target, "refused", refusal.message, runs=runs, **detail)


async def end(plane: Plane, caller: Caller, run_id: str) -> RunRecord:
    await run_for(plane, caller, run_id, "run.end", audit=True)
    try:
        async with plane.transaction():
            run = await plane.open.runs.end(run_id, time.time())
            await plane.audit(caller, "run.end", run_id, "ok", "ended", ended_at=run.ended_at)
    except UnknownRun:
        raise _unknown(run_id) from None
    return run


async def save_checkpoint(plane: Plane, caller: Caller, run_id: str, data: dict[str, Any]) -> Checkpoint:
    await run_for(plane, caller, run_id, "checkpoint.save", audit=True)
    async with plane.transaction():
        checkpoint = await plane.open.runs.save_checkpoint(run_id, data, time.time())
        await plane.audit(caller, "checkpoint.save", run_id, "ok", "saved", seq=checkpoint.seq)
    return checkpoint


async def latest_checkpoint(plane: Plane, caller: Caller, run_id: str) -> Checkpoint:
    await run_for(plane, caller, run_id, "checkpoint.read", audit=False)
    checkpoint = await plane.open.runs.latest_checkpoint(run_id)
    if checkpoint is None:
        raise Refused(404, "no_checkpoint", f"run {run_id} has saved no checkpoint")
    return checkpoint


#: How often each process writes the lease grants it made to the run store.
GRANTS_EVERY_S: Final = 1.0


async def record_grants(plane: Plane) -> None:
    """Write the lease grants this process made to the run store, a batch every
    ``GRANTS_EVERY_S`` (one transaction), so a run's lease age can be read from any process: not
    on the renewal's path, which only notes the grant in memory. A failed write loses only that
    batch (each run's next renewal is noted again). Runs until cancelled by its owner."""
    leases = plane.leases
    if leases is None:
        return
    while True:
        await anyio.sleep(GRANTS_EVERY_S)
        grants = leases.take_grants()
        if grants:
            with contextlib.suppress(RegistryUnavailable):
                await plane.open.runs.note_grants(grants)
