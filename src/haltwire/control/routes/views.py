"""How the control plane's records are written as JSON: one function per record, used by every route.

A record's schema in the OpenAPI document is its dataclass's (``StopRecord``, ``RunRecord``,
``Intent``...); the answers that wrap records, and the error body, are the ``TypedDict``s here.
The document closes every one of them (``openapi.py``): each field always written, no other.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from haltwire.control.access import reads_every_stop
from haltwire.control.config import Caller, Role
from haltwire.control.reports import SECTIONS, RunReport
from haltwire.intents import Intent, intent_fields
from haltwire.stops import Change, StopRecord
from haltwire.store.audit import AuditRecord
from haltwire.store.credentials import CredentialRecord
from haltwire.store.runs import Checkpoint, RunRecord
from haltwire.tokens import Grant


class ErrorObject(TypedDict):
    """``Refused.error()``: of every error body, and of each refused run in a batched renewal.
    Optional: who may (403), which stop refused (409 ``stopped``), the intent it cancelled."""

    code: str
    message: str
    retryable: bool
    needed_roles: NotRequired[list[str]]
    scope: NotRequired[str]
    stop_id: NotRequired[str]
    reason: NotRequired[str]
    intent: NotRequired[Intent]


class Error(TypedDict):
    error: ErrorObject


class Health(TypedDict):
    ok: Literal[True]
    revision: int


class Whoami(TypedDict):
    """Who a bearer token is (``agent``, ``tenant`` and ``version`` for role agent only), and
    whether it is sent every stop: an enforcement point refuses to serve with a token that is not."""

    name: str
    role: Role
    agent: str | None
    tenant: str | None
    version: str | None
    reads_every_stop: bool
    #: A drill's identity: what it writes is drill data (``haltwire.control.drills``).
    drill: bool


class StopList(TypedDict):
    stops: list[StopRecord]


class AuditList(TypedDict):
    records: list[AuditRecord]


class AuditHead(TypedDict):
    seq: int
    hash: str
    #: ``SEQ:HASH``, as ``expect_head`` takes it.
    head: str


class RunList(TypedDict):
    runs: list[RunRecord]


class IntentList(TypedDict):
    intents: list[Intent]


class Registration(TypedDict):
    run: RunRecord
    lease: Grant
    checkpoint: Checkpoint | None


class Renewals(TypedDict):
    leases: dict[str, Grant]
    refused: dict[str, ErrorObject]


class Credential(TypedDict):
    """An issued credential: the token and its map entry, less the run (the caller named it)."""

    token: str
    jti: str
    audience: str
    issued_at: float
    expires_at: float
    kid: str


class CredentialList(TypedDict):
    credentials: list[CredentialRecord]


class FiringRecorded(TypedDict):
    """``POST /v1/tripwire-firings``: whether it was recorded now (false: a repeat)."""

    recorded: bool


class CallsRecorded(TypedDict):
    """``POST /v1/runs/{id}/calls`` (and ``/usage``): items recorded now, and recorded before (a repeat)."""

    recorded: int
    repeated: int


def whoami_json(who: Caller) -> Whoami:
    agent = who.role == "agent"
    return {
        "name": who.name,
        "role": who.role,
        "agent": who.agent if agent else None,
        "tenant": who.tenant if agent else None,
        "version": who.version if agent else None,
        "reads_every_stop": reads_every_stop(who.role),
        "drill": who.drill,
    }


def stop_json(stop: StopRecord) -> dict[str, Any]:
    return {**asdict(stop), "cleared": stop.cleared}


def change_json(change: Change) -> dict[str, Any]:
    return {"revision": change.revision, "kind": change.kind, "stop": stop_json(change.stop)}


def run_json(run: RunRecord) -> dict[str, Any]:
    return {**asdict(run), "tools": list(run.tools)}


def checkpoint_json(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    return None if checkpoint is None else asdict(checkpoint)


def intent_json(intent: Intent) -> dict[str, Any]:
    return intent_fields(intent)


def intents_json(intents: list[Intent]) -> dict[str, Any]:
    return {"intents": [intent_json(i) for i in intents]}


def credential_json(token: str, record: CredentialRecord) -> Credential:
    return {
        "token": token,
        "jti": record.jti,
        "audience": record.audience,
        "issued_at": record.issued_at,
        "expires_at": record.expires_at,
        "kid": record.kid,
    }


def report_json(report: RunReport) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run_json(report.run) | {"drill": report.drill}}  # as GET /v1/runs/{id}
    for section in SECTIONS:
        out[section] = [intent_json(i) for i in getattr(report, section)]
    out["stops"] = [stop_json(s) for s in report.stops]
    out["calls"] = [asdict(c) for c in report.calls]
    out["usage"] = asdict(report.usage)
    out["timeline"] = [asdict(t) for t in report.timeline]
    out["drill"] = report.drill
    return out
