"""``GET /metrics`` on the admin listener (``AdminOnly``): the control plane's metrics
(``haltwire.control.metrics``) in the Prometheus text format, for operators, tripwires and
viewers (``metrics.read``), authorized as the rest of the admin API is. In this order: a token
(401 without a known one), its role (403), then the stores are read and the sample written."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from haltwire.control.access import authenticate, authorize
from haltwire.control.errors import Refused
from haltwire.control.metrics import ControlMetrics
from haltwire.control.routes.wire import answer
from haltwire.metrics import CONTENT_TYPE, exposition
from haltwire.store.registry import RegistryUnavailable

PATH = "/metrics"


async def serve_metrics(metrics: ControlMetrics, scope: Scope, receive: Receive, send: Send) -> None:
    plane = metrics.plane
    try:
        who = authenticate(plane, Headers(scope=scope).get("authorization"))
        await authorize(plane, who, "metrics.read")
        await metrics.refresh()
    except Refused as exc:
        await answer(exc)(scope, receive, send)
        return
    except RegistryUnavailable as exc:
        await answer(Refused(503, "registry_unreachable", f"the stores cannot be read now: {exc}"))(
            scope, receive, send
        )
        return
    body = exposition(metrics.registry)
    headers = [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
