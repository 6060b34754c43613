"""The control plane's HTTP API: the stop registry, its audit log and the watch stream.

Every request resolves its caller from the bearer token (a SHA-256 dict lookup) and is then
allowed or refused by role (``ROLES``). Every write, and every refused write by a known
caller, is appended to the audit log. A failing registry or audit store answers 503 with a
JSON error (fail closed), never a traceback. The watch stream is server-sent events of
registry changes after a revision (``?since=N`` or ``Last-Event-ID``), with a heartbeat.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Final

import anyio
from pydantic import Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from haltwire.control.broker import Broker
from haltwire.control.broker import routes as broker_routes
from haltwire.control.config import Caller, ControlConfig
from haltwire.control.intents import cancel_for_stop
from haltwire.control.intents import routes as intent_routes
from haltwire.control.leases import LeaseDesk
from haltwire.control.mirror import StopMirror
from haltwire.control.openapi import openapi_json
from haltwire.control.reports import routes as report_routes
from haltwire.control.runs import routes as run_routes
from haltwire.control.stores import Stores, open_stores
from haltwire.control.wire import Body, Refused, parse_body
from haltwire.identity import bearer_token, token_sha256
from haltwire.refusal import unauthenticated
from haltwire.scope import ScopeError
from haltwire.stops import Change, StopRecord
from haltwire.store.audit import Outcome, verify
from haltwire.store.registry import AlreadyCleared, RegistryUnavailable, UnknownStop

#: Which roles may call which endpoint (the role-matrix test checks this table).
ROLES: Final[Mapping[str, frozenset[str]]] = {
    "stop.issue": frozenset({"operator", "tripwire"}),
    "stop.clear": frozenset({"operator"}),
    "stops.read": frozenset({"operator", "tripwire", "gateway", "executor", "viewer", "agent"}),
    "audit.read": frozenset({"operator", "viewer"}),
    "watch": frozenset({"operator", "gateway", "executor", "viewer", "agent"}),
    # Runs and leases (haltwire.control.runs); an agent acts only on the runs it registered.
    # An executor holds a lease of its own too (its runs carry its identity's name as agent).
    "run.register": frozenset({"agent", "executor"}),
    "lease.renew": frozenset({"agent", "executor"}),
    "run.end": frozenset({"agent", "executor", "operator"}),
    "checkpoint.save": frozenset({"agent"}),
    "checkpoint.read": frozenset({"agent", "operator", "viewer"}),
    "run.read": frozenset({"operator", "viewer", "executor", "gateway", "tripwire", "agent"}),
    "runs.list": frozenset({"operator", "viewer"}),
    # The credential broker (haltwire.control.broker): an agent asks for its own runs only.
    "credential.issue": frozenset({"agent"}),
    "credentials.read": frozenset({"operator", "viewer", "agent"}),
    # Intents (haltwire.control.intents): the gateway records them, the executor claims and
    # settles them, operators decide the ones awaiting approval; an agent reads its own.
    "intent.create": frozenset({"gateway"}),
    "intent.read": frozenset({"operator", "viewer", "executor", "gateway", "agent"}),
    "intents.list": frozenset({"operator", "viewer", "executor", "gateway"}),
    "intent.claim": frozenset({"executor"}),
    "intent.commit": frozenset({"executor"}),
    "intent.fail": frozenset({"executor"}),
    "intent.unknown": frozenset({"executor"}),
    "intent.check": frozenset({"executor"}),
    "intent.approve": frozenset({"operator"}),
    "intent.reject": frozenset({"operator"}),
    # Run reports (haltwire.control.reports): read-only; an agent reads its own runs' only.
    "run.report": frozenset({"operator", "viewer", "agent"}),
}


class IssueBody(Body):
    scope: str
    reason: str = Field(min_length=1)
    expires_at: float | None = Field(default=None, allow_inf_nan=False)  # inf made every stops list a 500


class ClearBody(Body):
    reason: str = Field(min_length=1)


def stop_json(stop: StopRecord) -> dict[str, Any]:
    return {**asdict(stop), "cleared": stop.cleared}


def change_json(change: Change) -> dict[str, Any]:
    return {"revision": change.revision, "kind": change.kind, "stop": stop_json(change.stop)}


class Plane:
    """The running control plane's state, held in ``app.state.plane``."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.callers = config.callers()
        self.heartbeat_s = config.control.heartbeat_s
        self.stores: Stores | None = None
        self._changed = anyio.Event()
        self._run_agents: dict[str, str] = {}
        #: Grants leases to runs; None without [leases] (the run endpoints answer 501).
        self.leases = LeaseDesk.from_config(config)
        #: The stops the plane's own decisions check (leases, credentials, new intents): the
        #: lease desk's mirror, or one of its own without [leases].
        self.mirror = self.leases.mirror if self.leases else StopMirror()
        #: Issues run credentials; None without [broker] (the credential endpoints answer 501).
        self.broker = Broker.from_config(config, self.mirror)
        #: One [[intent_limits]] stop at a time, so checks past a run's limit together write one.
        self.limit_stops = anyio.Lock()

    @property
    def open(self) -> Stores:
        if self.stores is None:
            raise RegistryUnavailable("the control plane's stores are not open")
        return self.stores

    def notify(self) -> None:
        """Wake every watcher: the registry has a new change."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    @property
    def changed(self) -> anyio.Event:
        return self._changed

    async def visible_to(self, caller: Caller, scope: str) -> bool:
        """An agent sees only the stops that can stop it: global ones, and those on its agent
        id, its tenant, a version of its agent, or one of its runs. Other roles see all."""
        if caller.role != "agent":
            return True
        if scope in ("global", f"agent:{caller.agent}", f"tenant:{caller.tenant}"):
            return True
        if scope.startswith(f"version:{caller.agent}@"):
            return True
        if scope.startswith("run:"):
            return await self.run_agent(scope.removeprefix("run:")) == caller.agent
        return False

    async def run_agent(self, run_id: str) -> str | None:
        """The agent a run belongs to (a run never changes hands, so it is cached)."""
        agent = self._run_agents.get(run_id)
        if agent is None:
            run = await self.open.runs.get(run_id)
            if run is None:
                return None
            if len(self._run_agents) >= 100_000:
                self._run_agents.clear()
            agent = self._run_agents[run_id] = run.agent
        return agent

    def caller(self, request: Request) -> Caller:
        header = request.headers.get("authorization")
        token = bearer_token(header)
        if token is None:
            reason = "no bearer token" if header is None else "malformed Authorization header"
            raise _unauthenticated(reason)
        caller = self.callers.get(token_sha256(token))
        if caller is None:
            raise _unauthenticated("unknown token")
        if caller.expired(time.time()):
            raise _unauthenticated("token expired")
        return caller

    async def authorize(self, request: Request, action: str, target: str = "", write: bool = False) -> Caller:
        caller = self.caller(request)
        needed = ROLES[action]
        if caller.role in needed:
            return caller
        message = f"role {caller.role} may not {action}; it needs role {' or '.join(sorted(needed))}"
        if write:
            await self.audit(caller, action, target, "refused", message)
        raise Refused(403, "forbidden", message, needed_roles=sorted(needed))

    async def audit(
        self, caller: Caller, action: str, target: str, outcome: Outcome, reason: str, **detail: Any
    ) -> None:
        await self.open.audit.append(
            caller.name, caller.role, action, target, outcome, reason, detail, now=time.time()
        )


def _unauthenticated(reason: str) -> Refused:
    refusal = unauthenticated(reason)
    return Refused(401, refusal.code, refusal.message)


def plane_of(request: Request) -> Plane:
    plane: Plane = request.app.state.plane
    return plane


async def issue_stop(request: Request) -> Response:
    plane = plane_of(request)
    caller = await plane.authorize(request, "stop.issue", write=True)
    try:
        body: IssueBody = await parse_body(request, IssueBody)
        stop = await record_stop(plane, caller, body.scope, body.reason, body.expires_at)
    except (Refused, ScopeError, ValueError) as exc:
        message = exc.message if isinstance(exc, Refused) else str(exc)
        await plane.audit(caller, "stop.issue", "", "refused", message)
        raise Refused(422, "invalid_request", message) from None
    return JSONResponse(stop_json(stop), status_code=201)


async def record_stop(
    plane: Plane, caller: Caller, scope: str, reason: str, expires_at: float | None = None
) -> StopRecord:
    """Write a stop, wake the watchers, audit it and cancel the pending intents it covers.

    Used by ``POST /v1/stops`` and by the control plane's own rules (``[[intent_limits]]``).
    The intents are cancelled before this returns: once a stop is acknowledged, no intent it
    covers is still pending. A failure there is logged, not raised: the stop stands.
    """
    stop = await plane.open.registry.issue_stop(
        scope, reason, caller.name, now=time.time(), expires_at=expires_at
    )
    plane.notify()
    await plane.audit(caller, "stop.issue", stop.scope, "ok", stop.reason, stop_id=stop.stop_id)
    await cancel_for_stop(plane, caller, stop)
    return stop


async def clear_stop(request: Request) -> Response:
    plane = plane_of(request)
    stop_id = request.path_params["stop_id"]
    caller = await plane.authorize(request, "stop.clear", stop_id, write=True)
    registry = plane.open.registry
    try:
        body: ClearBody = await parse_body(request, ClearBody)
        stop = await registry.clear_stop(stop_id, caller.name, body.reason, now=time.time())
    except Refused as exc:
        await plane.audit(caller, "stop.clear", stop_id, "refused", exc.message)
        raise
    except UnknownStop:
        await plane.audit(caller, "stop.clear", stop_id, "refused", "no such stop")
        raise Refused(404, "unknown_stop", f"no stop has the id {stop_id}") from None
    except AlreadyCleared as exc:
        await plane.audit(caller, "stop.clear", stop_id, "refused", str(exc))
        raise Refused(409, "already_cleared", str(exc)) from None
    plane.notify()
    await plane.audit(caller, "stop.clear", stop_id, "ok", body.reason, scope=stop.scope)
    return JSONResponse(stop_json(stop))


async def list_stops(request: Request) -> Response:
    plane = plane_of(request)
    caller = await plane.authorize(request, "stops.read")
    registry = plane.open.registry
    if request.query_params.get("all") in ("1", "true", "yes"):
        stops = await registry.all_stops()
    else:
        stops = await registry.active_stops(now=time.time())
    return JSONResponse({"stops": [stop_json(s) for s in stops if await plane.visible_to(caller, s.scope)]})


async def list_audit(request: Request) -> Response:
    plane = plane_of(request)
    await plane.authorize(request, "audit.read")
    records = await plane.open.audit.records(target=request.query_params.get("target"))
    return JSONResponse({"records": [asdict(r) for r in records]})


async def verify_audit(request: Request) -> Response:
    plane = plane_of(request)
    await plane.authorize(request, "audit.read")
    return JSONResponse(asdict(verify(await plane.open.audit.records())))


def _revision(text: str | None, name: str) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        raise Refused(422, "invalid_request", f"{name} must be a revision number, not {text!r}") from None
    if value < 0:
        raise Refused(422, "invalid_request", f"{name} must not be negative")
    if value >= 2**63:  # past any store's revision column (64-bit): it made SQLite raise, a 500
        raise Refused(422, "invalid_request", f"{name} must be below 2**63")
    return value


async def watch(request: Request) -> Response:
    plane = plane_of(request)
    caller = await plane.authorize(request, "watch")
    last_id = request.headers.get("last-event-id")
    since = (
        _revision(last_id, "Last-Event-ID")
        if last_id is not None
        else _revision(request.query_params.get("since"), "since")
    )
    registry = plane.open.registry
    first = await registry.changes_since(since)  # a failing store answers 503 before streaming

    async def events() -> AsyncIterator[ServerSentEvent]:
        changes, last, replayed = first, since, False
        while True:
            for c in changes:
                last = c.revision
                if await plane.visible_to(caller, c.stop.scope):
                    yield ServerSentEvent(
                        json.dumps(change_json(c), separators=(",", ":")), event=c.kind, id=str(c.revision)
                    )
            changed = plane.changed  # taken before the read: a write after it wakes us
            if not changes and not replayed:
                # Every missed change is sent: only from here may a watcher count itself current.
                replayed = True
                yield ServerSentEvent(comment="caught-up", sep="\n")
            if not changes:
                # Woken by a write (ours, or another replica's via the registry's
                # follow_writes), else re-read once a heartbeat period as a fallback.
                with anyio.move_on_after(plane.heartbeat_s):
                    await changed.wait()
            try:
                changes = await registry.changes_since(last)
            except RegistryUnavailable as exc:
                yield ServerSentEvent(json.dumps({"error": str(exc)}), event="error")
                return

    return EventSourceResponse(
        events(),
        ping=plane.heartbeat_s,
        sep="\n",
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat", sep="\n"),
        headers={"Cache-Control": "no-store"},
    )


async def healthz(request: Request) -> Response:
    plane = plane_of(request)
    try:
        revision = await plane.open.registry.revision()
    except RegistryUnavailable as exc:
        raise Refused(503, "registry_unavailable", str(exc)) from None
    return JSONResponse({"ok": True, "revision": revision})


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return exc.response()


async def _unavailable(request: Request, exc: Exception) -> Response:
    return Refused(503, "registry_unavailable", f"the stop registry is unavailable: {exc}").response()


routes = [
    Route("/healthz", healthz),
    Route("/v1/stops", issue_stop, methods=["POST"]),
    Route("/v1/stops", list_stops, methods=["GET"]),
    Route("/v1/stops/{stop_id}/clear", clear_stop, methods=["POST"]),
    Route("/v1/audit", list_audit),
    Route("/v1/audit/verify", verify_audit),
    Route("/v1/watch", watch),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    *run_routes,
    *broker_routes,
    *intent_routes,
    *report_routes,
]


def create_app(config: ControlConfig, stores: Stores | None = None) -> Starlette:
    """The control plane. Without ``stores``, they open when the app starts and close when it stops."""
    plane = Plane(config)

    @asynccontextmanager
    async def following(opened: Stores) -> AsyncIterator[None]:
        # The app owns this task: writes by other replicas wake our watchers until shutdown.
        plane.stores = opened
        async with anyio.create_task_group() as tg:
            tg.start_soon(opened.registry.follow_writes, plane.notify)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                plane.stores = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if stores is not None:
            async with following(stores):
                yield
            return
        async with open_stores(config.registry) as opened, following(opened):
            yield

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={Refused: _refused, RegistryUnavailable: _unavailable},
    )
    app.state.plane = plane
    return app
