"""Routes of runs and leases: register, renew (one run, or a batch), end, checkpoints, read, list."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Final

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control import runs
from haltwire.control.errors import Refused
from haltwire.control.routes.views import checkpoint_json, run_json
from haltwire.control.routes.wire import Body, body, caller, parse_body, plane_of, query_limit

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


async def register_run(request: Request) -> Response:
    plane = plane_of(request)
    who = await caller(request, "run.register", write=True)
    runs.desk(plane)  # 501 before the body is read
    asked = await body(request, who, RegisterBody, "run.register")
    done = await runs.register(plane, who, asked.run_id, asked.tools, asked.agent_class, asked.resume_from)
    answer = {"run": run_json(done.run), "lease": done.lease.json(), "checkpoint": checkpoint_json(done.checkpoint)}
    return JSONResponse(answer, status_code=201)


async def renew_lease(request: Request) -> Response:
    who = await caller(request, "lease.renew")
    run_id = request.path_params["run_id"]
    granted, refused = await runs.renew(plane_of(request), who, [run_id])
    if run_id in refused:
        raise refused[run_id]
    return JSONResponse(granted[run_id].json())


async def renew_leases(request: Request) -> Response:
    plane = plane_of(request)
    who = await caller(request, "lease.renew")
    runs.desk(plane)
    asked: RenewBody = await parse_body(request, RenewBody)  # a read: refusals are not audited
    granted, refused = await runs.renew(plane, who, asked.runs)
    leases = {run_id: grant.json() for run_id, grant in granted.items()}
    return JSONResponse({"leases": leases, "refused": {run_id: r.error() for run_id, r in refused.items()}})


async def end_run(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    who = await caller(request, "run.end", run_id, write=True)
    return JSONResponse(run_json(await runs.end(plane_of(request), who, run_id)))


async def save_checkpoint(request: Request) -> Response:
    plane = plane_of(request)
    run_id = request.path_params["run_id"]
    who = await caller(request, "checkpoint.save", run_id, write=True)
    if len(await request.body()) > MAX_CHECKPOINT_BYTES:
        too_large = Refused(413, "payload_too_large", f"a checkpoint is at most {MAX_CHECKPOINT_BYTES} bytes")
        raise await plane.refuse(who, "checkpoint.save", run_id, too_large)
    asked = await body(request, who, CheckpointBody, "checkpoint.save", run_id)
    return JSONResponse(asdict(await runs.save_checkpoint(plane, who, run_id, asked.data)))


async def latest_checkpoint(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    who = await caller(request, "checkpoint.read")
    return JSONResponse(asdict(await runs.latest_checkpoint(plane_of(request), who, run_id)))


async def get_run(request: Request) -> Response:
    who = await caller(request, "run.read")
    run = await runs.run_for(plane_of(request), who, request.path_params["run_id"], "run.read", audit=False)
    return JSONResponse(run_json(run))


async def list_runs(request: Request) -> Response:
    await caller(request, "runs.list")
    limit = query_limit(request, most=MAX_BATCH)
    return JSONResponse({"runs": [run_json(r) for r in await plane_of(request).open.runs.list(limit)]})


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
