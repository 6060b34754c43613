"""Routes of runs and leases: register, renew (one run, or a batch), end, checkpoints, read, list."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Final

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import runs
from haltwire.control.plane import Plane
from haltwire.control.routes.fields import Id, IdPath, Name
from haltwire.control.routes.views import Registration, Renewals, RunList, checkpoint_json, run_json
from haltwire.control.routes.wire import (
    FORBIDDEN_RUN,
    STOPPED,
    UNKNOWN_RUN,
    Body,
    Route,
    body,
    caller,
    limit_query,
    parse_body,
    plane_of,
    query_limit,
)
from haltwire.limits import MAX_ITEMS
from haltwire.store.runs import Checkpoint, RunRecord
from haltwire.tokens import Grant

#: A run id in a path.
RunId = IdPath


class RegisterBody(Body):
    run_id: Id | None = None
    tools: list[Name] = Field(default_factory=list, max_length=MAX_ITEMS)
    agent_class: Name = "default"
    resume_from: Id | None = None


class RenewBody(Body):
    runs: list[Id] = Field(min_length=1, max_length=MAX_ITEMS)


class CheckpointBody(Body):
    #: A run's resumable state, not its transcript: bounded by the body's limit.
    #: NaN and infinities are refused as the body is parsed (``wire.parse_body``).
    data: dict[str, Any]


def _run_json(plane: Plane, run: RunRecord) -> dict[str, Any]:
    """The run as the API serves it, saying whether it is a drill's (``haltwire.control.drills``)."""
    return run_json(run) | {"drill": plane.drills.of_tenant(run.tenant)}


async def register_run(request: Request) -> Response:
    """Register a run and grant its first lease"""
    plane = plane_of(request)
    who = await caller(request, "run.register", write=True)
    runs.desk(plane)  # 501 before the body is read
    asked = await body(request, who, RegisterBody, "run.register")
    done = await runs.register(plane, who, asked.run_id, asked.tools, asked.agent_class, asked.resume_from)
    answer = {"run": _run_json(plane, done.run), "lease": done.lease.json(), "checkpoint": checkpoint_json(done.checkpoint)}
    return JSONResponse(answer, status_code=201)


async def renew_lease(request: Request, run_id: RunId) -> Response:
    """Renew a run's lease"""
    who = await caller(request, "lease.renew")
    granted, refused = await runs.renew(plane_of(request), who, [run_id])
    if run_id in refused:
        raise refused[run_id]
    return JSONResponse(granted[run_id].json())


async def renew_leases(request: Request) -> Response:
    """Renew many runs' leases in one request"""
    plane = plane_of(request)
    who = await caller(request, "lease.renew")
    runs.desk(plane)
    asked: RenewBody = await parse_body(request, RenewBody)  # a read: refusals are not audited
    granted, refused = await runs.renew(plane, who, asked.runs)
    leases = {run_id: grant.json() for run_id, grant in granted.items()}
    return JSONResponse({"leases": leases, "refused": {run_id: r.error() for run_id, r in refused.items()}})


async def end_run(request: Request, run_id: RunId) -> Response:
    """End a run: it gets no more leases"""
    who = await caller(request, "run.end", run_id, write=True)
    plane = plane_of(request)
    return JSONResponse(_run_json(plane, await runs.end(plane, who, run_id)))


async def save_checkpoint(request: Request, run_id: RunId) -> Response:
    """Save a run's next checkpoint"""
    plane = plane_of(request)
    who = await caller(request, "checkpoint.save", run_id, write=True)
    asked = await body(request, who, CheckpointBody, "checkpoint.save", run_id)
    return JSONResponse(asdict(await runs.save_checkpoint(plane, who, run_id, asked.data)))


async def latest_checkpoint(request: Request, run_id: RunId) -> Response:
    """A run's latest checkpoint"""
    who = await caller(request, "checkpoint.read")
    return JSONResponse(asdict(await runs.latest_checkpoint(plane_of(request), who, run_id)))


async def get_run(request: Request, run_id: RunId) -> Response:
    """One run"""
    who = await caller(request, "run.read")
    plane = plane_of(request)
    run = await runs.run_for(plane, who, run_id, "run.read", audit=False)
    return JSONResponse(_run_json(plane, run))


async def list_runs(request: Request) -> Response:
    """The most recently registered runs, newest first"""
    await caller(request, "runs.list")
    limit = query_limit(request, most=MAX_ITEMS)
    plane = plane_of(request)
    listed = await plane.open.runs.list(limit)
    return JSONResponse({"runs": [_run_json(plane, r) for r in listed]})


#: A run just registered can be read, renewed, checkpointed, reported and ended through these links.
RUN_LINKS: Final = {
    operation_id: {"operationId": operation_id, "parameters": {"run_id": "$response.body#/run/run_id"}}
    for operation_id in (
        "get_run",
        "renew_lease",
        "save_checkpoint",
        "latest_checkpoint",
        "end_run",
        "issue_credential",
        "list_credentials",
        "run_report",
    )
}

routes = [
    Route(
        "POST",
        "/v1/runs",
        register_run,
        "run.register",
        (201, Registration, "the run, its first lease and the checkpoint it resumes from"),
        (
            (
                409,
                f"run_exists: a run with this id was registered before; or {STOPPED} (nothing is recorded)",
            ),
            (
                422,
                "invalid_request: the body is invalid, the agent_class unknown, "
                "or resume_from not a run of this agent in this tenant",
            ),
            501,
            503,
        ),
        body=RegisterBody,
        links=RUN_LINKS,
    ),
    Route(
        "GET",
        "/v1/runs",
        list_runs,
        "runs.list",
        (200, RunList, "the runs"),
        ((422, f"invalid_request: limit is not a number from 1 to {MAX_ITEMS}"), 503),
        query=[limit_query(MAX_ITEMS, "runs")],
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}",
        get_run,
        "run.read",
        (200, RunRecord, "the run"),
        (FORBIDDEN_RUN, UNKNOWN_RUN, 503),
    ),
    Route(
        "POST",
        "/v1/runs/{run_id}/lease",
        renew_lease,
        "lease.renew",
        (200, Grant, "the new lease"),
        (
            FORBIDDEN_RUN,
            UNKNOWN_RUN,
            (409, f"{STOPPED}; or run_ended: the run has ended and gets no more leases"),
            501,
            503,
        ),
    ),
    Route(
        "POST",
        "/v1/runs/{run_id}/end",
        end_run,
        "run.end",
        (200, RunRecord, "the run, ended_at set (by the first end)"),
        (FORBIDDEN_RUN, UNKNOWN_RUN, 503),
    ),
    Route(
        "PUT",
        "/v1/runs/{run_id}/checkpoint",
        save_checkpoint,
        "checkpoint.save",
        (200, Checkpoint, "the checkpoint saved"),
        (
            FORBIDDEN_RUN,
            UNKNOWN_RUN,
            422,
            503,
        ),
        body=CheckpointBody,
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}/checkpoint",
        latest_checkpoint,
        "checkpoint.read",
        (200, Checkpoint, "the latest checkpoint"),
        (FORBIDDEN_RUN, (404, f"{UNKNOWN_RUN[1]}; or no_checkpoint: the run has saved no checkpoint"), 503),
    ),
    Route(
        "POST",
        "/v1/leases/renew",
        renew_leases,
        "lease.renew",
        (200, Renewals, "a lease for each run granted one, an error for each refused"),
        (422, 501, 503),
        body=RenewBody,
    ),
]
