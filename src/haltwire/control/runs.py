"""The control plane's run and lease endpoints: register a run, renew its lease, end it, checkpoint it.

An agent identity owns the runs registered with its agent id; only it renews, ends (an
operator may too) and checkpoints them. Every registration, end and checkpoint is audited,
refused ones too; a refused renewal is audited once per run and reason (a refused runtime
keeps renewing every few seconds until it notices), runs refused by one stop in one request
sharing a record; successful renewals are not audited (one per run every few seconds).
The lease policy itself is ``haltwire.control.leases``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any, Final

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# app.py imports this module for its routes: use its names at call time, not import time.
from haltwire.control import app as http
from haltwire.control.config import Caller
from haltwire.control.leases import LeaseDesk, LeaseRefused, refused
from haltwire.control.wire import Body, Refused, parse_body, query_limit
from haltwire.store.runs import Checkpoint, RunExists, RunRecord, UnknownRun, new_run_id
from haltwire.tokens import Grant

RUN_ID: Final = r"^[A-Za-z0-9_.:-]{1,128}$"
MAX_BATCH: Final = 1000
#: A checkpoint is a run's resumable state, not its transcript: bounded, so one run cannot fill the store.
MAX_CHECKPOINT_BYTES: Final = 1 << 20


class RegisterBody(Body):
    run_id: str | None = Field(default=None, pattern=RUN_ID)
    tools: list[str] = Field(default_factory=list, max_length=MAX_BATCH)
    agent_class: str = "default"
    resume_from: str | None = None


class RenewBody(Body):
    runs: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class CheckpointBody(Body):
    data: dict[str, Any]

    @field_validator("data")
    @classmethod
    def _strict_json(cls, data: dict[str, Any]) -> dict[str, Any]:
        # Python's JSON reads NaN and 1e400 (infinity); no JSON response may carry them back.
        try:
            json.dumps(data, allow_nan=False)
        except ValueError:
            raise ValueError("a checkpoint may not hold NaN or infinite numbers") from None
        return data


def run_json(run: RunRecord) -> dict[str, Any]:
    return {**asdict(run), "tools": list(run.tools)}


def checkpoint_json(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    return None if checkpoint is None else asdict(checkpoint)


def _desk(plane: http.Plane) -> LeaseDesk:
    if plane.leases is None:
        raise Refused(501, "leases_not_configured", "this control plane has no [leases] keys")
    return plane.leases


def as_refused(refusal: LeaseRefused) -> Refused:
    extra = {k: v for k, v in refusal.error.items() if k not in ("code", "message", "retryable")}
    return Refused(refusal.status, refusal.code, str(refusal.error["message"]), **extra)


def _owns(caller: Caller, run: RunRecord, action: str) -> bool:
    # An agent acts on and reads its own runs only; an executor acts on its own, reads any.
    if caller.role == "executor" and action == "run.read":
        return True
    return caller.runs_as is None or caller.runs_as == run.agent


def _not_owner(caller: Caller, run_id: str) -> LeaseRefused:
    return refused(403, "forbidden", f"run {run_id} belongs to another agent than {caller.runs_as}")


def _unknown(run_id: str) -> LeaseRefused:
    return refused(404, "unknown_run", f"no run has the id {run_id}")


async def run_for(plane: http.Plane, caller: Caller, run_id: str, action: str, audit: bool) -> RunRecord:
    """The run, if it exists and ``caller`` may act on it; refusals are audited when ``audit``."""
    run = await plane.open.runs.get(run_id)
    if run is not None and _owns(caller, run, action):
        return run
    problem = _unknown(run_id) if run is None else _not_owner(caller, run_id)
    if audit:
        await plane.audit(caller, action, run_id, "refused", str(problem.error["message"]))
    raise as_refused(problem)


async def register_run(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "run.register", write=True)
    desk = _desk(plane)
    agent = caller.runs_as
    assert agent is not None  # roles agent (the config requires an agent id) and executor
    stores = plane.open

    async def refuse(exc: Refused, target: str = "") -> Refused:
        await plane.audit(caller, "run.register", target, "refused", exc.message, code=exc.code)
        return exc

    try:
        body: RegisterBody = await parse_body(request, RegisterBody)
    except Refused as exc:
        raise await refuse(exc) from None
    run_id = body.run_id or new_run_id()
    if body.agent_class not in desk.classes:
        known = ", ".join(sorted(desk.classes))
        raise await refuse(
            Refused(422, "invalid_request", f"unknown agent_class {body.agent_class!r}; known: {known}"),
            run_id,
        )
    checkpoint = None
    if body.resume_from is not None:
        earlier = await stores.runs.get(body.resume_from)
        if earlier is None or earlier.agent != agent:
            message = f"resume_from: {body.resume_from} is not a run of agent {agent}"
            raise await refuse(Refused(422, "invalid_request", message), run_id)
        checkpoint = await stores.runs.latest_checkpoint(body.resume_from)
    run = RunRecord(
        run_id=run_id,
        agent=agent,
        tenant=caller.tenant,
        version=caller.version,
        tools=tuple(body.tools),
        agent_class=body.agent_class,
        registered_by=caller.name,
        registered_at=desk.clock(),
        resumed_from=body.resume_from,
    )
    await desk.catch_up(stores.registry)
    refusal = desk.check(run)
    if refusal is not None:  # nothing is recorded for a run that could not start
        raise await refuse(as_refused(refusal), run_id)
    try:
        await stores.runs.register(run)
    except RunExists as exc:
        raise await refuse(Refused(409, "run_exists", str(exc)), run_id) from None
    grant = desk.grant(run)
    if isinstance(grant, LeaseRefused):  # a stop landed between the check and the grant
        raise await refuse(as_refused(grant), run_id)
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
    body_json = {"run": run_json(run), "lease": grant.json(), "checkpoint": checkpoint_json(checkpoint)}
    return JSONResponse(body_json, status_code=201)


def _renewal(desk: LeaseDesk, caller: Caller, run_id: str, run: RunRecord | None) -> Grant | LeaseRefused:
    if run is None:
        return _unknown(run_id)
    return desk.grant(run) if _owns(caller, run, "lease.renew") else _not_owner(caller, run_id)


async def _audit_refusals(
    plane: http.Plane, desk: LeaseDesk, caller: Caller, refused_runs: dict[str, LeaseRefused]
) -> None:
    """Audit each run's refusal the first time it is refused for that reason.

    Runs refused by one stop share one record (target: the stop's scope, as for the stop's
    own ``stop.issue`` record), so a global stop over thousands of live runs costs a few
    appends per batch, not one per run. Unknown runs are not audited: anyone can name any
    number of run ids.
    """
    groups: dict[tuple[str, str], tuple[LeaseRefused, list[str]]] = {}
    for run_id, refusal in refused_runs.items():
        if refusal.code == "unknown_run" or not desk.first_refusal(run_id, refusal):
            continue
        scope = refusal.error.get("scope")
        key = (refusal.code, str(refusal.error["stop_id"])) if scope else (refusal.code, run_id)
        groups.setdefault(key, (refusal, []))[1].append(run_id)
    for refusal, runs in groups.values():
        scope = refusal.error.get("scope")
        target = str(scope) if scope else runs[0]
        detail = {k: v for k, v in refusal.error.items() if k in ("code", "stop_id")}
        message = str(refusal.error["message"])
        await plane.audit(caller, "lease.renew", target, "refused", message, runs=runs, **detail)


async def renew_lease(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "lease.renew")
    desk = _desk(plane)
    run_id = request.path_params["run_id"]
    await desk.catch_up(plane.open.registry)
    result = _renewal(desk, caller, run_id, await plane.open.runs.get(run_id))
    if isinstance(result, LeaseRefused):
        await _audit_refusals(plane, desk, caller, {run_id: result})
        raise as_refused(result)
    return JSONResponse(result.json())


async def renew_leases(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "lease.renew")
    desk = _desk(plane)
    body: RenewBody = await parse_body(request, RenewBody)
    await desk.catch_up(plane.open.registry)  # once per batch: every run is checked at one revision
    found = await plane.open.runs.get_many(body.runs)
    leases: dict[str, dict[str, Any]] = {}
    refused_runs: dict[str, LeaseRefused] = {}
    for run_id in dict.fromkeys(body.runs):
        result = _renewal(desk, caller, run_id, found.get(run_id))
        if isinstance(result, Grant):
            leases[run_id] = result.json()
        else:
            refused_runs[run_id] = result
    await _audit_refusals(plane, desk, caller, refused_runs)
    refusals = {run_id: r.error for run_id, r in refused_runs.items()}
    return JSONResponse({"leases": leases, "refused": refusals})


async def end_run(request: Request) -> Response:
    plane = http.plane_of(request)
    run_id = request.path_params["run_id"]
    caller = await plane.authorize(request, "run.end", run_id, write=True)
    await run_for(plane, caller, run_id, "run.end", audit=True)
    try:
        run = await plane.open.runs.end(run_id, time.time())
    except UnknownRun:
        raise as_refused(_unknown(run_id)) from None
    await plane.audit(caller, "run.end", run_id, "ok", "ended", ended_at=run.ended_at)
    return JSONResponse(run_json(run))


async def save_checkpoint(request: Request) -> Response:
    plane = http.plane_of(request)
    run_id = request.path_params["run_id"]
    caller = await plane.authorize(request, "checkpoint.save", run_id, write=True)
    try:
        if len(await request.body()) > MAX_CHECKPOINT_BYTES:
            raise Refused(413, "payload_too_large", f"a checkpoint is at most {MAX_CHECKPOINT_BYTES} bytes")
        body: CheckpointBody = await parse_body(request, CheckpointBody)
    except Refused as exc:
        await plane.audit(caller, "checkpoint.save", run_id, "refused", exc.message)
        raise
    await run_for(plane, caller, run_id, "checkpoint.save", audit=True)
    checkpoint = await plane.open.runs.save_checkpoint(run_id, body.data, time.time())
    await plane.audit(caller, "checkpoint.save", run_id, "ok", "saved", seq=checkpoint.seq)
    return JSONResponse(asdict(checkpoint))


async def latest_checkpoint(request: Request) -> Response:
    plane = http.plane_of(request)
    run_id = request.path_params["run_id"]
    caller = await plane.authorize(request, "checkpoint.read")
    await run_for(plane, caller, run_id, "checkpoint.read", audit=False)
    checkpoint = await plane.open.runs.latest_checkpoint(run_id)
    if checkpoint is None:
        raise Refused(404, "no_checkpoint", f"run {run_id} has saved no checkpoint")
    return JSONResponse(asdict(checkpoint))


async def get_run(request: Request) -> Response:
    plane = http.plane_of(request)
    caller = await plane.authorize(request, "run.read")
    run = await run_for(plane, caller, request.path_params["run_id"], "run.read", audit=False)
    return JSONResponse(run_json(run))


async def list_runs(request: Request) -> Response:
    plane = http.plane_of(request)
    await plane.authorize(request, "runs.list")
    limit = query_limit(request, most=MAX_BATCH)
    return JSONResponse({"runs": [run_json(r) for r in await plane.open.runs.list(limit)]})


routes = [
    Route("/v1/runs", register_run, methods=["POST"]),
    Route("/v1/runs", list_runs, methods=["GET"]),
    Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
    Route("/v1/runs/{run_id}/lease", renew_lease, methods=["POST"]),
    Route("/v1/runs/{run_id}/end", end_run, methods=["POST"]),
    Route("/v1/runs/{run_id}/checkpoint", save_checkpoint, methods=["PUT"]),
    Route("/v1/runs/{run_id}/checkpoint", latest_checkpoint, methods=["GET"]),
    Route("/v1/leases/renew", renew_leases, methods=["POST"]),
]
