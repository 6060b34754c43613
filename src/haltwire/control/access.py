"""Who may do what at the control plane: callers from bearer tokens, actions by role, what an agent sees.

A caller is resolved from the request's bearer token only (a SHA-256 dict lookup), then allowed
or refused by role (``ROLES``, which the role-matrix test checks). A refused write by a known
caller is audited; an unknown token is refused without a record, so it cannot flood the log.

Whose a run is (``ownership``, the one rule every run, intent and ``run:`` stop check uses): the
identity's that registered it, the same agent id in the same tenant; any version of that agent
(a new version resumes and renews its tenant's runs, as ``version:`` stops tell them apart). A
run of another tenant is answered as a run that does not exist (404 ``unknown_run``, audited as
refused), so an agent cannot learn another tenant's run ids; another agent's run in the caller's
tenant is 403 ``forbidden``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final, Literal, get_args

from haltwire import refusal
from haltwire.control.config import Caller, Role
from haltwire.control.errors import Refused
from haltwire.control.plane import Plane
from haltwire.identity import bearer_token, token_sha256

#: Which roles may take which action.
ROLES: Final[Mapping[str, frozenset[str]]] = {
    "stop.issue": frozenset({"operator", "tripwire"}),
    "stop.clear": frozenset({"operator"}),
    "stops.read": frozenset({"operator", "tripwire", "gateway", "executor", "viewer", "agent"}),
    "audit.read": frozenset({"operator", "viewer"}),
    "watch": frozenset({"operator", "gateway", "executor", "viewer", "agent"}),
    # Runs and leases: an agent acts only on the runs it registered. An executor holds a lease
    # of its own too (its runs carry its identity's name as agent).
    "run.register": frozenset({"agent", "executor"}),
    "lease.renew": frozenset({"agent", "executor"}),
    "run.end": frozenset({"agent", "executor", "operator"}),
    "checkpoint.save": frozenset({"agent"}),
    "checkpoint.read": frozenset({"agent", "operator", "viewer"}),
    "run.read": frozenset({"operator", "viewer", "executor", "gateway", "tripwire", "agent"}),
    "runs.list": frozenset({"operator", "viewer"}),
    # The credential broker: an agent asks for its own runs only.
    "credential.issue": frozenset({"agent"}),
    "credentials.read": frozenset({"operator", "viewer", "agent"}),
    # Intents: the gateway records them, the executor claims and settles them, operators
    # decide the ones awaiting approval; an agent reads its own.
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
    # Run reports: read-only; an agent reads its own runs' only. The gateway records the calls a
    # stop found in flight, and the model tokens a run used, for the report.
    "run.report": frozenset({"operator", "viewer", "agent"}),
    "run.calls.record": frozenset({"gateway"}),
    "run.usage.record": frozenset({"gateway"}),
    # A gateway's tripwire in shadow mode records what it would have stopped.
    "tripwire.firing.record": frozenset({"tripwire"}),
    # /metrics, on the admin listener only (``haltwire.control.routes.metrics``).
    "metrics.read": frozenset({"operator", "tripwire", "viewer"}),
    # Who a token is, and whether it reads every stop (an enforcement point asks at start-up).
    "whoami": frozenset(get_args(Role)),
}

#: Whose a run (or an intent) is, as a caller sees it (``ownership``).
Ownership = Literal["own", "another_agent", "another_tenant"]

#: Roles that see only the stops that can stop them (``visible_to``), on every read and the watch.
NARROWED: Final = frozenset({"agent"})


def reads_every_stop(role: str) -> bool:
    """Whether a caller of ``role`` is sent every stop: it may follow the watch, and its view is
    not narrowed to the stops that can stop it. An enforcement point's token must (a gateway
    following the watch with an agent's token would miss every other agent's stops)."""
    return role in ROLES["watch"] and role not in NARROWED


def _unauthenticated(reason: str) -> Refused:
    said = refusal.unauthenticated(reason)
    return Refused(401, said.code, refusal.for_people(said))


def authenticate(plane: Plane, authorization: str | None) -> Caller:
    """The caller an ``Authorization`` header names; ``Refused`` 401 when none does."""
    token = bearer_token(authorization)
    if token is None:
        raise _unauthenticated("no bearer token" if authorization is None else "malformed Authorization header")
    caller = plane.callers.get(token_sha256(token))
    if caller is None:
        raise _unauthenticated("unknown token")
    if caller.expired(time.time()):
        raise _unauthenticated("token expired")
    return caller


async def authorize(plane: Plane, caller: Caller, action: str, target: str = "", write: bool = False) -> None:
    """Refuse (403) a caller whose role may not take ``action``; a refused write is audited."""
    needed = ROLES[action]
    if caller.role in needed:
        return
    message = f"role {caller.role} may not {action}; it needs role {' or '.join(sorted(needed))}"
    if write:
        await plane.audit(caller, action, target, "refused", message)
    raise Refused(403, "forbidden", message, needed_roles=sorted(needed))


def ownership(caller: Caller, agent: str, tenant: str) -> Ownership:
    """Whose a run or an intent of ``agent`` in ``tenant`` is to ``caller``: its own when the
    caller's identity registered it (agent id and tenant; the version may differ). An executor's
    runs carry its name as agent. Roles that hold no runs are not narrowed by this (``ROLES``)."""
    if caller.runs_as is None:
        return "own"
    if caller.tenant != tenant:  # checked first: nothing of another tenant's run shows
        return "another_tenant"
    return "own" if caller.runs_as == agent else "another_agent"


async def visible_to(plane: Plane, caller: Caller, scope: str) -> bool:
    """An agent sees only the stops that can stop it: global ones, and those on its agent id,
    its tenant, a version of its agent, or one of its runs (``NARROWED``). Other roles see all."""
    if caller.role not in NARROWED:
        return True
    if scope in ("global", f"agent:{caller.agent}", f"tenant:{caller.tenant}"):
        return True
    if scope.startswith(f"version:{caller.agent}@"):
        return True
    if scope.startswith("run:"):
        owner = await plane.run_owner(scope.removeprefix("run:"))
        return owner is not None and ownership(caller, *owner) == "own"
    return False
