"""Routes of the credential broker: issue a run credential, read a run's credential map, the JWKS."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire.control import credentials
from haltwire.control.broker import Jwks
from haltwire.control.routes.fields import Name
from haltwire.control.routes.runs import RunId
from haltwire.control.routes.views import Credential, CredentialList, credential_json
from haltwire.control.routes.wire import (
    FORBIDDEN_RUN,
    STOPPED,
    UNKNOWN_RUN,
    Body,
    Route,
    body,
    caller,
    plane_of,
)
from haltwire.credentials import JWKS_PATH


class CredentialBody(Body):
    audience: Name


async def issue_credential(request: Request, run_id: RunId) -> Response:
    """Issue a short-lived credential for one of the run's downstream systems"""
    plane = plane_of(request)
    who = await caller(request, "credential.issue", run_id, write=True)
    credentials.broker(plane)  # 501 before the body is read
    asked = await body(request, who, CredentialBody, "credential.issue", run_id)
    token, record = await credentials.issue(plane, who, run_id, asked.audience)
    return JSONResponse(credential_json(token, record), status_code=201)


async def list_credentials(request: Request, run_id: RunId) -> Response:
    """The credential map of a run: every credential issued to it (never the tokens)"""
    who = await caller(request, "credentials.read")
    records = await credentials.listed(plane_of(request), who, run_id)
    return JSONResponse({"credentials": [asdict(r) for r in records]})


async def jwks(request: Request) -> Response:
    """The broker's public keys, to verify credentials with (every stop revokes the credentials
    issued before it on its scope: follow /v1/watch)"""
    keys = credentials.published_keys(plane_of(request))
    # Short caching: a verifier meeting an unknown kid refetches anyway.
    return JSONResponse(keys, headers={"Cache-Control": "public, max-age=60"})


_NOT_CONFIGURED = (501, "broker_not_configured: this control plane has no [broker]")
_NO_KEYS = (404, "broker_not_configured: this control plane has no [broker], so it publishes no keys")

routes = [
    Route(
        "POST",
        "/v1/runs/{run_id}/credentials",
        issue_credential,
        "credential.issue",
        (201, Credential, "the credential (a JWT signed with EdDSA) and its map entry"),
        (
            FORBIDDEN_RUN,
            UNKNOWN_RUN,
            (409, f"{STOPPED}; or run_ended: the run has ended and gets no more credentials"),
            (422, "invalid_request: the body is invalid or the audience is not configured"),
            _NOT_CONFIGURED,
            503,
        ),
        body=CredentialBody,
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}/credentials",
        list_credentials,
        "credentials.read",
        (200, CredentialList, "the credentials, oldest first"),
        (FORBIDDEN_RUN, UNKNOWN_RUN, 503),
    ),
    Route("GET", JWKS_PATH, jwks, None, (200, Jwks, "the JWKS"), (_NO_KEYS,)),
]
