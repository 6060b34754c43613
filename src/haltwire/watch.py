"""The stops the control plane has issued, kept current from its ``/v1/watch`` stream.

Used by every enforcement point that follows the control plane (the gateway, a credential
verifier in a downstream service); ``haltwire.sse`` reads the stream for them and for the
runtime SDK. ``StopWatch.run`` owns one streaming connection for its owner's lifetime. It replays
the registry's history at start-up (the gateway reports started only once it holds the
current stops), then applies each ``stop``/``clear`` event as it arrives, resuming with
``Last-Event-ID`` after any failure so a reconnect misses and repeats nothing. Once a
connection has replayed what was missed (the control plane's ``caught-up`` comment), every
event and heartbeat refreshes ``last_heard``; a follower that has heard nothing for
``staleness_s`` is not ``current`` and fails closed (the gateway refuses ``registry_unreachable``)
until it hears again.

Before it follows the stream, each connection asks the control plane who its token is
(``GET /v1/whoami``): a follower whose token is not sent every stop (an agent's sees only the
stops that can stop that agent) would enforce some stops and silently miss the rest, so it
refuses to start (``WrongRole``), and after start-up treats the answer as a failed connection
(it fails closed). The executor asks the same question through its own client and judges the
answer with ``require_every_stop``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Final, NamedTuple

import anyio
import anyio.abc
import httpx2

from haltwire.config import ControlLink
from haltwire.errors import describe, not_listening
from haltwire.replicas import Replicas
from haltwire.sse import CAUGHT_UP, sse_events
from haltwire.stops import ChangeKind, StopRecord, StopSet

log = logging.getLogger("haltwire.stops")

_FIELDS: Final = frozenset(f.name for f in fields(StopRecord))
RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
#: Before start-up, how often a control plane that is not listening yet is tried again.
START_RETRY_S = 0.2


#: Who a bearer token is at the control plane, and whether it is sent every stop.
WHOAMI_PATH: Final = "/v1/whoami"


class ControlUnreachable(Exception):
    """The control plane did not answer, or did not replay its stops, at start-up."""


class WrongRole(Exception):
    """The control plane refuses an enforcement point's token, or says it is not sent every stop:
    the point must not serve with it (``haltwire gateway`` and ``haltwire executor`` exit 2)."""


class Point(NamedTuple):
    """An enforcement point, as its refusal to start names it: what it is, and its token's role."""

    name: str
    role: str


GATEWAY: Final = Point("a gateway", "gateway")
EXECUTOR: Final = Point("an executor", "executor")
VERIFIER: Final = Point("a credential verifier", "viewer")
#: The egress proxy needs every stop, as a gateway does, and uses a gateway-role token.
EGRESS: Final = Point("an egress proxy", "gateway")


def require_every_stop(answer: Any, url: str, point: Point) -> None:
    """Judge the control plane's answer to ``GET /v1/whoami`` (the gateway's and the executor's
    start-up check): ``WrongRole`` unless it says the token is sent every stop."""
    if not isinstance(answer, dict) or not isinstance(answer.get("reads_every_stop"), bool):
        raise WrongRole(
            f"the control plane at {url} did not say whether this token is sent every stop "
            f"({WHOAMI_PATH}): {point.name} serves only once it does"
        )
    if not answer["reads_every_stop"]:
        raise WrongRole(
            f"the control plane at {url} knows this token as {answer.get('name')}, of role "
            f"{answer.get('role')}, which is not sent every stop: {point.name} needs a token of role "
            f"{point.role}"
        )


def token_refused(url: str, status: int, error: Any, point: Point) -> WrongRole:
    """The control plane refused the token itself (401, or 403 on a listener not serving its role)."""
    said = f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else "refused"
    return WrongRole(
        f"the control plane at {url} refused this token ({status} {said}): {point.name} needs a "
        f"token of role {point.role}"
    )


class StopWatch:
    def __init__(
        self,
        link: ControlLink,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
        point: Point = GATEWAY,
    ) -> None:
        self.link = link
        #: Who follows: named when the control plane refuses its token.
        self.point = point
        #: The replicas followed: one at a time, the next when it fails or falls silent.
        self.replicas = Replicas(link.urls)
        self._token = link.resolve_token()
        self.monotonic = monotonic
        #: Whose time a stop's expiry is judged by.
        self.clock = clock
        self.stops = StopSet()
        self._advanced = anyio.Event()
        self.last_heard: float | None = None
        #: True once the stops issued before start-up are applied (``run`` reported started).
        self.ready = False
        #: Why the last attempt failed, while no replica listens yet (before start-up).
        self._not_up: Exception | None = None
        #: Called with each new stop as it is applied, in this task and before the next event
        #: is read (the gateway cuts calls in flight here); they must not block.
        self.on_stop: list[Callable[[StopRecord], None]] = []
        #: Whether the stops held were last seen stale (fail closed), and whether the last
        #: connection failed: each change of either is logged once, as a warning.
        self.failing_closed = False
        self.unreachable = False

    def current(self) -> bool:
        """Whether the stops held are current: heard from within ``staleness_s`` (fail closed)."""
        heard = self.last_heard
        current = heard is not None and self.monotonic() - heard <= self.link.staleness_s
        if current is self.failing_closed and self.ready:
            self._turned(current)  # stale now and was not, or the reverse
        return current

    def _turned(self, current: bool) -> None:
        """Log the moment the stops held turn stale (the owner fails closed) or current again."""
        self.failing_closed = not current
        if current:
            log.warning("stops current again: the control plane at %s is heard; failing closed ends", self.url)
        else:
            log.warning(
                "stops stale: nothing heard from the control plane at %s for over %g s; failing closed "
                "(every call refused registry_unreachable) until it is heard again",
                self.url,
                self.link.staleness_s,
            )

    @property
    def revision(self) -> int:
        return self.stops.revision

    # -- applying the stream ---------------------------------------------------------------

    def apply(self, kind: str, data: dict[str, Any]) -> None:
        """Apply one ``stop``/``clear`` event's data (a change as the control plane sends it)."""
        record = StopRecord(**{k: v for k, v in data["stop"].items() if k in _FIELDS})
        change: ChangeKind = "stop" if kind == "stop" else "clear"
        self.stops.apply(change, record, int(data["revision"]))
        advanced, self._advanced = self._advanced, anyio.Event()
        advanced.set()
        if change == "stop":
            for listener in self.on_stop:
                try:
                    listener(record)
                except Exception:
                    # A listener's bug must not cost the stream (and with it every stop after).
                    log.exception("a listener failed on stop %s", record.stop_id)

    async def reached(self, revision: int) -> None:
        """Return once the change with ``revision`` has been applied (the caller bounds the wait)."""
        while self.revision < revision:
            await self._advanced.wait()

    def _heard(self) -> None:
        self.last_heard = self.monotonic()
        if self.failing_closed:
            self._turned(True)

    @property
    def url(self) -> str:
        """The replica followed now."""
        return self.replicas.current

    async def _check_role(self, http: httpx2.AsyncClient, url: str) -> None:
        """``WrongRole`` unless the control plane at ``url`` sends this token every stop."""
        r = await http.get(f"{url}{WHOAMI_PATH}", headers={"Authorization": f"Bearer {self._token}"})
        if r.status_code in (401, 403):
            try:
                error = r.json().get("error")
            except (ValueError, AttributeError):
                error = None
            raise token_refused(url, r.status_code, error, self.point)
        r.raise_for_status()
        require_every_stop(r.json(), url, self.point)

    async def _follow(
        self, http: httpx2.AsyncClient, url: str, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        """One connection: check the token's role, then stream events until it fails or ends.

        Nothing counts as heard until the control plane's ``caught-up`` comment, which it
        sends once it has replayed every change we missed: a stream that stalls mid-replay
        must not make a gateway that lacks the stops issued during an outage look fresh.
        """
        await self._check_role(http, url)
        headers = {"Authorization": f"Bearer {self._token}", "Last-Event-ID": str(self.revision)}
        async with http.stream("GET", f"{url}/v1/watch", headers=headers) as response:
            response.raise_for_status()
            caught_up = False
            async for event in sse_events(response.aiter_lines()):
                if event.comment is not None:
                    if not caught_up and event.comment == CAUGHT_UP:
                        caught_up = True
                        if self.unreachable:
                            self.unreachable = False
                            log.warning("control plane %s reachable again: the stops missed are replayed", url)
                        if task_status is not anyio.TASK_STATUS_IGNORED:
                            self.ready = True
                            task_status.started()
                            task_status = anyio.TASK_STATUS_IGNORED
                elif event.kind == "error":
                    raise ControlUnreachable(f"the control plane reported: {event.data}")
                elif event.kind in ("stop", "clear"):
                    self.apply(event.kind, json.loads(event.data))
                if caught_up:
                    self._heard()
        raise ControlUnreachable("the watch stream ended")

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the watch stream for the owner's lifetime, reconnecting with a backoff.

        Reports started once the stops issued before start-up are applied. A failure moves to
        the next replica at once; only when every replica has failed in a row does it wait,
        doubling the wait while the stops are stale. Before start-up, replicas that are not
        listening yet are tried again every ``START_RETRY_S`` until ``start`` gives up; any
        other failure is raised (a start-up error), a token of the wrong role at once; after
        it, each failure is logged and retried.
        """
        # A silent connection (no event, no heartbeat) for silence_s is a dead one.
        timeout = httpx2.Timeout(10.0, read=self.link.silence_s)
        delay = RECONNECT_MIN_S
        failures = 0  # in a row, on any replica
        async with httpx2.AsyncClient(timeout=timeout) as http:
            while True:
                url, heard = self.replicas.current, self.last_heard
                try:
                    await self._follow(http, url, task_status)
                except Exception as exc:
                    # A stream that was heard from was a good one: count afresh from it.
                    failures = 1 if self.last_heard != heard else failures + 1
                    self.replicas.failed(url)
                    if not self.ready:
                        listening = not not_listening(exc)
                        if isinstance(exc, WrongRole) or (listening and failures >= len(self.replicas)):
                            raise  # never started, on any replica: a start-up error for the caller
                        if not listening:
                            # Not listening yet: waited for until ``start``'s connect_timeout_s,
                            # so the processes of a stack may start in any order.
                            self._not_up = exc
                        if failures >= len(self.replicas):
                            await anyio.sleep(START_RETRY_S)
                        continue
                    if not self.unreachable:
                        self.unreachable = True
                        log.warning("control plane unreachable: the watch on %s failed (%s)", url, describe(exc))
                    log.error(
                        "control plane %s: watch failed (%s); following %s",
                        url,
                        describe(exc),
                        self.replicas.current,
                    )
                if self.ready:
                    task_status = anyio.TASK_STATUS_IGNORED
                if failures < len(self.replicas):
                    continue  # another replica has not been tried since the last good stream
                await anyio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S) if not self.current() else RECONNECT_MIN_S

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        timeout = self.link.connect_timeout_s
        try:
            with anyio.fail_after(timeout):
                await tg.start(self.run)
        except WrongRole:
            raise  # not a control plane out of reach: one that refuses to serve this token every stop
        except TimeoutError as exc:
            why = f"not listening ({describe(self._not_up)})" if self._not_up else describe(exc)
            raise ControlUnreachable(
                f"control plane {self.url} did not replay its stops within {timeout:g} s: {why}"
            ) from exc
        except Exception as exc:
            raise ControlUnreachable(
                f"control plane {self.url} did not replay its stops: {describe(exc)}"
            ) from exc
