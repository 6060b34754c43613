"""A listener of its own for ``/metrics`` (the executor's ``[executor] metrics_port``, the egress
proxy's ``[egress] metrics_port``): a bare ASGI app, ``GET /metrics`` and 404 for anything else."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from haltwire.metrics import CONTENT_TYPE, exposition


def metrics_app(of: CollectorRegistry) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            status, headers, body = 200, [(b"content-type", CONTENT_TYPE.encode())], exposition(of)
        else:
            status, headers, body = 404, [(b"content-type", b"text/plain")], b"not found\n"
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
