"""Writing a tripped rule's stop to the control plane, as a ``tripwire`` identity, until it lands.

The gateway refuses the tripped scope at once by itself (``haltwire.tripwires.engine``); the stop
record is what makes every other enforcement point (other gateways, the executor, the lease desk,
the broker, the egress proxy) stop it too, and what the audit log and the run report show. So a
write is never given up while the gateway runs: ``StopWriter.run`` (a task owned by the
gateway's start-up task group, cancelled at shutdown) posts each queued trip as
``POST /v1/stops`` with an ``Idempotency-Key`` that names the trip, retrying with a doubling wait
(``RETRY_MIN_S`` to ``RETRY_MAX_S``) while the control plane cannot be reached or answers 5xx.
The key makes a retry whose first answer was lost harmless: the control plane answers what the
first request wrote. A 409 means another request with the key (another gateway with the same
token, tripping the same rule for the same scope) wrote the stop first: landed too. Any other
4xx is an answer (a token without the ``tripwire`` role, say): logged as an error, not repeated.

A firing in shadow mode takes the same queue and retries to ``POST /v1/tripwire-firings``
(``haltwire.control.firings``): recorded in the audit log and the run report as what the rule
would have stopped, with the time it would have fired; nothing is stopped.

Cancellation: a trip still unwritten when the task is cancelled (the gateway stopping) is logged
with its rule, scope and reason; the log is the record of last resort, and the gateway's local
refusal ends with the process.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.abc

from haltwire import refusal
from haltwire.errors import describe
from haltwire.limits import fitted
from haltwire.refusal import Refusal
from haltwire.replicas import ReplicaHttp, Unreachable
from haltwire.watch import WHOAMI_PATH, Point, WrongRole, token_refused

log = logging.getLogger("haltwire.tripwires")

REQUEST_TIMEOUT_S: Final = 10.0
RETRY_MIN_S: Final = 0.2
RETRY_MAX_S: Final = 10.0
#: Trips waiting to be written; past it a trip is logged, not queued (its local refusal holds).
MAX_WAITING: Final = 10_000
#: What the start-up check calls the writer, and the role its token needs.
TRIPWIRES: Final = Point("a gateway's tripwires", "tripwire")
#: Written trips remembered (so a trip of the same key is not written twice); the oldest go first.
MAX_LANDED: Final = 100_000


@dataclass(frozen=True, slots=True)
class Trip:
    """One rule firing: what it stops and why. ``key`` names it for the control plane (the
    request's ``Idempotency-Key``), the same for the same rule, scope, run and window."""

    rule: str
    kind: str
    mode: str
    scope: str
    key: str
    detail: str
    at: float
    figures: dict[str, Any] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()
    #: What the refusal tells the agent, when not ``detail`` (a content signal's text is withheld).
    told: str | None = None

    @property
    def reason(self) -> str:
        lines = [f"tripwire {self.rule} ({self.kind}, {self.mode}): {self.detail}"]
        if self.evidence:
            lines.append("evidence (calls that counted, at this gateway, newest last):")
            lines.extend(f"  {e}" for e in self.evidence)
        return fitted("\n".join(lines))

    def refusal(self, run: str | None) -> Refusal:
        """The refusal of a call in its scope (``told``, when given, instead of ``detail``)."""
        told = self.told or self.detail
        if self.scope.startswith("run:") and run is not None and self.scope == f"run:{run}":
            return refusal.tripwire_tripped(self.rule, run, detail=told)
        return refusal.tripwire_tripped(self.rule, run or "", scope=self.scope, detail=told)


@dataclass(frozen=True, slots=True)
class Landed:
    """A trip's stop as the control plane recorded it; ``revision`` 0 when another request wrote it."""

    stop_id: str | None
    revision: int


class StopWriter:
    def __init__(self, urls: str | tuple[str, ...], token: str) -> None:
        self._http = ReplicaHttp(urls, token, REQUEST_TIMEOUT_S)
        self._waiting: dict[str, Trip] = {}
        self._wake = anyio.Event()
        #: Trips written (or found written), by key, the newest ``MAX_LANDED``.
        self.landed: OrderedDict[str, Landed] = OrderedDict()
        #: Called with each trip once it has landed (the engine releases its local refusal).
        self.on_landed: Callable[[Trip, Landed], None] | None = None
        #: Failed attempts, for tests and logs.
        self.failures = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def write(self, trip: Trip) -> None:
        """Queue ``trip``'s stop; never blocks. A trip already queued or written is not queued again."""
        if trip.key in self._waiting or trip.key in self.landed:
            return
        if len(self._waiting) >= MAX_WAITING:
            log.error("tripwire stop not queued (%d waiting): %s %s", MAX_WAITING, trip.scope, trip.reason)
            return
        self._waiting[trip.key] = trip
        self._wake.set()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def check(self) -> None:
        """Start-up: ``WrongRole`` when the control plane refuses the token or knows it by another
        role than ``tripwire`` (a URL on the enforcement listener, say). A control plane that does
        not answer is logged: the stops are written once it does."""
        try:
            with anyio.fail_after(REQUEST_TIMEOUT_S):
                r = await self._http.request("GET", WHOAMI_PATH)
        except (TimeoutError, Unreachable) as exc:
            log.warning(
                "cannot check the tripwire token (%s); its stops are retried until it answers", describe(exc)
            )
            return
        url = self._http.replicas.current
        if r.status_code in (401, 403):
            try:
                error = r.json().get("error")
            except (ValueError, AttributeError):
                error = None
            raise token_refused(url, r.status_code, error, TRIPWIRES)
        try:
            role = r.json().get("role") if r.status_code == 200 else None
        except (ValueError, AttributeError):
            role = None
        if r.status_code == 200 and role != "tripwire":
            raise WrongRole(
                f"the control plane at {url} knows the [tripwire_stops] token by role {role}: "
                f"{TRIPWIRES.name} need a token of role tripwire"
            )
        if r.status_code != 200:
            log.warning("cannot check the tripwire token (HTTP %d at %s)", r.status_code, url)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write what is queued until cancelled (see the module's docstring)."""
        task_status.started()
        wait = RETRY_MIN_S
        try:
            while True:
                if not self._waiting:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                if await self._attempt_all():
                    wait = RETRY_MIN_S
                else:
                    await anyio.sleep(wait)
                    wait = min(wait * 2, RETRY_MAX_S)
        finally:
            for trip in self._waiting.values():
                log.error(
                    "tripwire stop not written (the gateway is stopping): %s %s", trip.scope, trip.reason
                )

    async def _attempt_all(self) -> bool:
        """One attempt at each waiting trip, oldest first; False at the first that fails."""
        for key, trip in list(self._waiting.items()):
            done, landed = await self._attempt(trip)
            if not done:
                return False
            del self._waiting[key]
            if landed is not None:
                self.landed[key] = landed
                while len(self.landed) > MAX_LANDED:
                    self.landed.popitem(last=False)
                if self.on_landed is not None:
                    self.on_landed(trip, landed)
        return True

    async def _attempt(self, trip: Trip) -> tuple[bool, Landed | None]:
        """(done, the stop as written: None when refused for good, logged); not done: try again."""
        if trip.mode == "shadow":
            path = "/v1/tripwire-firings"
            body: dict[str, Any] = {
                "firing_id": trip.key,
                "rule": trip.rule,
                "kind": trip.kind,
                "scope": trip.scope,
                "reason": trip.reason,
                "fired_at": trip.at,
            }
        else:
            path, body = "/v1/stops", {"scope": trip.scope, "reason": trip.reason, "rule": trip.rule}
        try:
            with anyio.fail_after(REQUEST_TIMEOUT_S):
                response = await self._http.request(
                    "POST", path, json=body, headers={"Idempotency-Key": trip.key}
                )
        except (TimeoutError, Unreachable) as exc:
            problem = describe(exc)
        else:
            status = response.status_code
            if status in (200, 201) and trip.mode == "shadow":
                return True, None
            if status in (200, 201):
                answer = response.json()
                log.warning("tripwire %s stopped %s: stop %s", trip.rule, trip.scope, answer.get("stop_id"))
                return True, Landed(answer.get("stop_id"), int(answer.get("revision", 0)))
            if status == 409:
                return True, Landed(None, 0)
            if status < 500:
                log.error(
                    "the control plane refused tripwire %s's stop of %s (HTTP %d: %s); only this gateway "
                    "refuses it",
                    trip.rule,
                    trip.scope,
                    status,
                    response.text[:300],
                )
                return True, None
            problem = f"HTTP {status}"
        self.failures += 1
        log.warning("writing tripwire %s's stop of %s failed (%s); retrying", trip.rule, trip.scope, problem)
        return False, None
