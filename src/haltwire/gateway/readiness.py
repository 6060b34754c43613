"""Whether the gateway is ready to serve calls: ``GET /readyz`` (``GET /healthz`` says only that
the process answers), and its start as the calls that come during it see it (``Start``).

Ready means started, every upstream connected, and, with ``[control]``, the stops replayed and
heard from within ``staleness_s``: a gateway failing closed (every call refused
``registry_unreachable``) is not ready, and is again once the watch is back. The answer names
what is missing in words, never a URL, a token or a key: it is served without authentication.
"""

from __future__ import annotations

import json
from typing import Final

import anyio

from haltwire.gateway.proxy import Gateway

READY: Final = b'{"ready":true}'
#: A call that waited for a start that failed or was stopped (the process is going away).
NOT_STARTED: Final = (
    b'{"error":{"code":"not_started","message":"The gateway did not start, or it is stopping.",'
    b'"retryable":true}}'
)


class Start:
    """The gateway's start: ``haltwire gateway`` serves its port while it starts, and a call that
    comes meanwhile waits for it (as it would in the listen backlog), or is answered 503
    if the start fails or the gateway stops first."""

    def __init__(self) -> None:
        self.done = False
        self._over = False
        self._event: anyio.Event | None = None  # made in the event loop, by the first to wait

    def finished(self) -> None:
        self.done = True
        self._wake()

    def given_up(self) -> None:
        """No call waits any more: the start failed, or the gateway is stopping."""
        self._over = True
        self._wake()

    async def wait(self) -> bool:
        """Until the start is over: True when it finished, False when it was given up on."""
        if not self.done and not self._over:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self.done

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()


def not_ready(gateway: Gateway, started: bool) -> list[str]:
    """What keeps the gateway from serving calls now; empty when it is ready."""
    missing = [] if started else ["the gateway is starting"]
    missing += [f"upstream {name} is not connected" for name in gateway.upstreams.not_connected()]
    watch = gateway.stops
    if watch is not None:
        if not watch.ready:
            missing.append("the control plane's stops are not replayed yet")
        elif not watch.current():
            missing.append(
                f"nothing heard from the control plane for over {watch.link.staleness_s:g} s: "
                "every call is refused registry_unreachable"
            )
    return missing


def readiness(gateway: Gateway, started: bool) -> tuple[int, bytes]:
    """``/readyz``'s status and JSON body: 200 when ready, else 503 and what is missing."""
    missing = not_ready(gateway, started)
    if not missing:
        return 200, READY
    return 503, json.dumps({"ready": False, "not_ready": missing}, separators=(",", ":")).encode()
