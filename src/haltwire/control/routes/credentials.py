"""Routes of the credential broker: issue a run credential, read a run's credential map, the JWKS."""

from __future__ import annotations

from dataclasses import asdict

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control import credentials
from haltwire.control.routes.views import credential_json
from haltwire.control.routes.wire import Body, body, caller, plane_of
from haltwire.credentials import JWKS_PATH


class CredentialBody(Body):
    audience: str = Field(min_length=1, max_length=256)


async def issue_credential(request: Request) -> Response:
    plane = plane_of(request)
    run_id = request.path_params["run_id"]
    who = await caller(request, "credential.issue", run_id, write=True)
    credentials.broker(plane)  # 501 before the body is read
    asked = await body(request, who, CredentialBody, "credential.issue", run_id)
    token, record = await credentials.issue(plane, who, run_id, asked.audience)
    return JSONResponse(credential_json(token, record), status_code=201)


async def list_credentials(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    who = await caller(request, "credentials.read")
    records = await credentials.listed(plane_of(request), who, run_id)
    return JSONResponse({"credentials": [asdict(r) for r in records]})


async def jwks(request: Request) -> Response:
    broker = credentials.broker(plane_of(request))
    # Short caching: a verifier meeting an unknown kid refetches anyway.
    return JSONResponse(broker.keys.jwks(), headers={"Cache-Control": "public, max-age=60"})


routes = [
    Route("/v1/runs/{run_id}/credentials", issue_credential, methods=["POST"]),
    Route("/v1/runs/{run_id}/credentials", list_credentials, methods=["GET"]),
    Route(JWKS_PATH, jwks, methods=["GET"]),
]
