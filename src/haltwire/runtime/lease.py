"""A run's lease inside the agent process: level 1 of the stop ladder.

``Lease.start(control, ...)`` registers a run and holds its lease for the ``async with``
block. It owns three tasks, all cancelled when the block exits:

- renewal: every ``renew_every_s``. A refusal (a stop matches the run, the run ended) ends
  the lease at once; a failure or a timeout never extends it, so it ages out;
- expiry: ends the lease when its local deadline passes;
- the watch (push, ``follow_stops``): a stop on one of the run's scopes ends the lease as
  soon as it is pushed, without waiting for the next renewal.

A runtime hosting many runs uses ``LeasePool`` instead: one batched renewal and one watch
for all of them.

Expiry is judged on the local monotonic clock from when the granting request was *sent*
(the grant may have sat in a queue; the wall clock may jump), and at ``renew_timeout_s``
rather than ``ttl_s``: the runtime gives up before the gateway would refuse it, so it does
not start work it could not finish. ``require()`` raises ``StopRequested`` once the lease
has ended; ``ended`` is an event for code that must cancel work in flight (``Guard``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, MutableMapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from haltwire.errors import unwrapped
from haltwire.runtime.client import ControlClient, ControlRefused, ControlUnreachable, Registration
from haltwire.runtime.egress import proxy_env
from haltwire.scope import Scope, run_scopes
from haltwire.tokens import Grant

log = logging.getLogger("haltwire.runtime")

_WATCH_RETRY_MIN_S = 0.2
_WATCH_RETRY_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class StopNotice:
    """Why a run must stop: a refusal code and, for ``stopped``, the stop that matched."""

    code: str
    message: str
    scope: str | None = None
    stop_id: str | None = None
    reason: str | None = None

    @classmethod
    def from_error(cls, error: dict[str, Any]) -> StopNotice:
        return cls(
            code=str(error.get("code", "refused")),
            message=str(error.get("message", "the control plane refused the lease")),
            scope=error.get("scope"),
            stop_id=error.get("stop_id"),
            reason=error.get("reason"),
        )


class StopRequested(Exception):
    """The run must stop now. ``notice`` says why."""

    def __init__(self, notice: StopNotice) -> None:
        super().__init__(notice.message)
        self.notice = notice


class Lease:
    def __init__(
        self,
        control: ControlClient,
        registration: Registration,
        *,
        sent_at: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.run: dict[str, Any] = registration.run
        self.run_id: str = registration.grant.run_id
        run = registration.run
        self.scopes = run_scopes(
            str(run["run_id"]), str(run["agent"]), str(run["tenant"]), str(run["version"])
        )
        #: The checkpoint this run resumed from (``resume_from``), if any.
        self.checkpoint = registration.checkpoint
        self._monotonic = monotonic
        self._grant = registration.grant
        self._deadline = sent_at + registration.grant.renew_timeout_s
        self._last_attempt = sent_at
        #: Why the lease ended; None while it holds.
        self.notice: StopNotice | None = None
        #: Set once the lease has ended (refused, stopped, or run out).
        self.ended = anyio.Event()
        # Broker credentials by audience: (token, when to ask again on the monotonic clock).
        self._credentials: dict[str, tuple[str, float]] = {}
        # Called after each renewal that brings a new token (``export_proxy_env``).
        self._on_renewal: list[Callable[[], None]] = []

    @classmethod
    async def register(
        cls,
        control: ControlClient,
        *,
        run_id: str | None = None,
        tools: Sequence[str] = (),
        agent_class: str = "default",
        resume_from: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> Lease:
        """Register a run; its lease, not yet renewed by anyone. ``StopRequested`` if a stop
        already matches it. ``Lease.start`` and ``LeasePool`` renew it."""
        sent = monotonic()
        try:
            registration = await control.register_run(
                run_id=run_id, tools=tools, agent_class=agent_class, resume_from=resume_from
            )
        except ControlRefused as exc:
            if exc.code == "stopped":
                raise StopRequested(StopNotice.from_error(exc.error)) from None
            raise
        return cls(control, registration, sent_at=sent, monotonic=monotonic)

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        control: ControlClient,
        *,
        run_id: str | None = None,
        tools: Sequence[str] = (),
        agent_class: str = "default",
        resume_from: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        push: bool = True,
    ) -> AsyncIterator[Lease]:
        """Register a run and hold its lease for the block; ``StopRequested`` if a stop already
        matches it."""
        lease = await cls.register(
            control,
            run_id=run_id,
            tools=tools,
            agent_class=agent_class,
            resume_from=resume_from,
            monotonic=monotonic,
        )
        # The block's own exception (StopRequested, say) comes out as itself.
        with unwrapped():
            async with anyio.create_task_group() as tg:
                tg.start_soon(lease._renew_forever)
                tg.start_soon(lease._expire_on_time)
                if push:
                    tg.start_soon(follow_stops, control, lease.generation, lambda: [lease])
                try:
                    yield lease
                finally:
                    tg.cancel_scope.cancel()  # the lease's tasks end with the block

    # -- the checks --------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return self._grant.token

    @property
    def generation(self) -> int:
        return self._grant.generation

    @property
    def renew_every_s(self) -> float:
        return self._grant.renew_every_s

    @property
    def deadline(self) -> float:
        """When the lease runs out, on the local monotonic clock."""
        return self._deadline

    def remaining_s(self) -> float:
        """Seconds left on the local clock; 0 once ended."""
        return 0.0 if self.notice is not None else max(0.0, self._deadline - self._monotonic())

    def require(self) -> str:
        """The lease token, or ``StopRequested`` once the lease has ended or run out."""
        if self.notice is None and self._monotonic() >= self._deadline:
            self._end(self._ran_out())
        if self.notice is not None:
            raise StopRequested(self.notice)
        return self._grant.token

    async def credential(self, audience: str) -> str:
        """A broker credential for ``audience`` (a downstream system), reused until two thirds
        of its life have passed. ``StopRequested`` once the run must stop: the broker refuses
        a stopped run, and this lease's own state is checked first."""
        self.require()
        held = self._credentials.get(audience)
        if held is not None and self._monotonic() < held[1]:
            return held[0]
        sent = self._monotonic()
        try:
            issued = await self.control.credential(self.run_id, audience)
        except ControlRefused as exc:
            if exc.code in ("stopped", "run_ended"):
                self._end(StopNotice.from_error(exc.error))
                raise StopRequested(self.notice or StopNotice.from_error(exc.error)) from None
            raise
        issued_at, expires_at = float(issued["issued_at"]), float(issued["expires_at"])
        token = str(issued["token"])
        # Its lifetime is measured on our clock from the request: the broker's clock may differ.
        self._credentials[audience] = (token, sent + (expires_at - issued_at) * 2 / 3)
        return token

    def proxy_env(self, proxy_url: str, *, no_proxy: str = "") -> dict[str, str]:
        """``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` (both cases) for going out through the
        egress proxy at ``proxy_url`` with this lease's current token (``haltwire.runtime.egress``).
        ``StopRequested`` once the lease has ended."""
        return proxy_env(proxy_url, self.run_id, self.require(), no_proxy)

    def export_proxy_env(
        self, proxy_url: str, *, no_proxy: str = "", environ: MutableMapping[str, str] | None = None
    ) -> None:
        """Write ``proxy_env`` into ``environ`` (``os.environ``) now and after every renewal, so
        that this process's clients and every subprocess started later carry the current token."""
        target = os.environ if environ is None else environ

        def write() -> None:
            target.update(proxy_env(proxy_url, self.run_id, self._grant.token, no_proxy))

        target.update(self.proxy_env(proxy_url, no_proxy=no_proxy))
        self._on_renewal.append(write)

    async def save_checkpoint(self, data: dict[str, Any]) -> dict[str, Any]:
        """Save where the run is, for a later run to ``resume_from`` after a stop is cleared."""
        return await self.control.save_checkpoint(self.run_id, data)

    # -- the tasks ---------------------------------------------------------------------------

    def _end(self, notice: StopNotice) -> None:
        if self.notice is None:
            self.notice = notice
            self.ended.set()
            log.info("run %s: lease ended: %s", self.run_id, notice.message)

    def _ran_out(self) -> StopNotice:
        return StopNotice(
            "lease_expired",
            f"the lease of run {self.run_id} ran out: not renewed for {self._grant.renew_timeout_s:g} s",
        )

    def _granted(self, grant: Grant, sent: float) -> None:
        # Never revive an ended lease: a stop or an expiry is final for this run.
        if self.notice is None and sent + grant.renew_timeout_s > self._deadline:
            self._grant, self._deadline = grant, sent + grant.renew_timeout_s
            for renewed in self._on_renewal:
                renewed()

    async def _renew_forever(self) -> None:
        while self.notice is None:
            await anyio.sleep(max(0.0, self._last_attempt + self._grant.renew_every_s - self._monotonic()))
            sent = self._last_attempt = self._monotonic()
            budget = min(self._grant.renew_every_s, self._deadline - sent)
            if budget <= 0:
                return  # run out: the expiry task ends it
            try:
                # A renewal slower than the interval is abandoned (its answer would be stale).
                with anyio.fail_after(budget):
                    grant = await self.control.renew(self.run_id)
            except ControlRefused as exc:
                self._end(StopNotice.from_error(exc.error))
                return
            except (ControlUnreachable, TimeoutError) as exc:
                log.warning("run %s: renewal failed (%s); the lease is not extended", self.run_id, exc)
                continue
            self._granted(grant, sent)

    async def _expire_on_time(self) -> None:
        while self.notice is None:
            remaining = self._deadline - self._monotonic()
            if remaining <= 0:
                self._end(self._ran_out())
                return
            await anyio.sleep(remaining)

    def _stopped(self, stop: dict[str, Any]) -> None:
        self._end(
            StopNotice(
                "stopped",
                f"run {self.run_id} was stopped ({stop['scope']}): {stop['reason']}",
                scope=stop["scope"],
                stop_id=stop["stop_id"],
                reason=stop["reason"],
            )
        )


async def follow_stops(control: ControlClient, since: int, live: Callable[[], Collection[Lease]]) -> None:
    """Push: end each live lease that a stop on the watch covers, as soon as it arrives.

    Follows the watch from revision ``since`` (a grant's generation: every later change is
    news), reconnecting with a backoff, until no lease is live. Losing the watch ends no
    lease: renewal and expiry still bound the stop.
    """
    delay = _WATCH_RETRY_MIN_S
    while live():
        try:
            async for kind, change in control.watch(since):
                since, delay = int(change["revision"]), _WATCH_RETRY_MIN_S
                if kind != "stop":
                    continue
                stop = change["stop"]
                scope = Scope.parse(stop["scope"])
                for lease in [lease for lease in live() if scope in lease.scopes]:
                    lease._stopped(stop)
                if not live():
                    return
        except ControlUnreachable as exc:
            log.info("watch lost (%s); retrying in %.1f s", exc, delay)
        await anyio.sleep(delay)
        delay = min(delay * 2, _WATCH_RETRY_MAX_S)
