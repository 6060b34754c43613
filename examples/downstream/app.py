"""A downstream service that trusts haltwire's run credentials, and nothing else.

``GET /orders/{order_id}`` answers only a request whose bearer token is a credential the
control plane's broker issued for this service's audience, still unexpired by this
process's clock, and not revoked: a stop on the run (or its agent, tenant, version, or a
global stop) revokes every credential the run was issued before the stop, within the watch
stream's propagation bound, even though the credential itself has minutes left. Refused
requests get 401 (503 while the stop registry cannot be heard from: fail closed).

Run it (the token is a control-plane identity with role viewer, gateway or executor)::

    HALTWIRE_CONTROL_URL=http://127.0.0.1:8700 HALTWIRE_TOKEN=... DOWNSTREAM_AUDIENCE=orders \\
        python examples/downstream/app.py --port 8900
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.credentials import CredentialRefused, CredentialVerifier
from haltwire.identity import bearer_token

#: A stand-in for the service's data.
ORDERS = {"1001": {"status": "shipped", "total": 42.5}, "1002": {"status": "pending", "total": 7.0}}


def _refused(code: str, message: str, status: int = 401) -> Response:
    headers = {"WWW-Authenticate": 'Bearer realm="downstream"'} if status == 401 else {}
    body = {"error": {"code": code, "message": message, "retryable": status == 503}}
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(verifier: CredentialVerifier) -> Starlette:
    async def order(request: Request) -> Response:
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            return _refused("credential_missing", "send a haltwire run credential as the bearer token")
        try:
            claims = await verifier.verify(token)
        except CredentialRefused as exc:
            return _refused(exc.code, exc.message, 503 if exc.retryable else 401)
        order_id = request.path_params["order_id"]
        found = ORDERS.get(order_id)
        if found is None:
            return JSONResponse({"error": {"code": "not_found", "message": f"no order {order_id}"}}, 404)
        # Who asked is known down to the run: log it, scope data by tenant, and so on.
        return JSONResponse({"order_id": order_id, **found, "run": claims.run, "agent": claims.agent})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with verifier.running():  # the JWKS fetched and the stops replayed before serving
            yield

    return Starlette(routes=[Route("/orders/{order_id}", order)], lifespan=lifespan)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    args = parser.parse_args()
    verifier = CredentialVerifier.connect(
        os.environ["HALTWIRE_CONTROL_URL"],
        os.environ["HALTWIRE_TOKEN"],
        os.environ.get("DOWNSTREAM_AUDIENCE", "orders"),
    )
    uvicorn.run(create_app(verifier), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
