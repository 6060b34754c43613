"""The control plane's OpenAPI 3.1 document, served at ``GET /openapi.json`` without a token.

Shapes are derived, not restated: request bodies from the pydantic models the handlers
validate with, responses from the dataclasses the handlers serialize (``StopRecord``,
``Change``, ``AuditRecord``, ``VerifyResult``, ``RunRecord``, ``Checkpoint``, ``Grant``,
``CredentialRecord``, ``Intent``, ``RunReport``), and
which operations can answer 403 from ``ROLES``. Response objects are closed
(``additionalProperties: false``, every field required, as ``asdict`` always writes every
field), so a field added to a record without the document noticing fails the schemathesis
run in tests/test_openapi.py. Error objects are closed too: their optional fields are the
ones handlers add (``needed_roles``; ``scope``, ``stop_id``, ``reason`` of a ``stopped``).
"""

from __future__ import annotations

import functools
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import haltwire
from haltwire.control.access import ROLES
from haltwire.control.config import Role
from haltwire.control.reports import RunReport, TimelineEntry
from haltwire.control.routes.credentials import CredentialBody
from haltwire.control.routes.intents import CommitBody, FailBody, IntentBody, RejectBody
from haltwire.control.routes.runs import (
    MAX_BATCH,
    MAX_CHECKPOINT_BYTES,
    RUN_ID,
    CheckpointBody,
    RegisterBody,
    RenewBody,
)
from haltwire.control.routes.stops import ClearBody, IssueBody
from haltwire.credentials import JWKS_PATH
from haltwire.intents import STATES, Intent
from haltwire.scope import KINDS
from haltwire.stops import Change, ChangeKind, StopRecord
from haltwire.store.audit import AuditRecord, VerifyResult
from haltwire.store.credentials import CredentialRecord
from haltwire.store.runs import Checkpoint, RunRecord
from haltwire.tokens import Grant

REF = "#/components/schemas/{model}"
JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A response object: every field is always written, and no other."""
    return {**schema, "required": list(schema["properties"]), "additionalProperties": False}


def _derived(schemas: dict[str, Any], kind: Any, extra: dict[str, Any] | None = None) -> None:
    schema = TypeAdapter(kind).json_schema(mode="serialization", ref_template=REF)
    schema.pop("$defs", None)  # nested dataclasses are derived under their own names
    schema["properties"].update(extra or {})
    schemas[schema["title"]] = _closed(schema)


def _body_schema(schemas: dict[str, Any], model: type[BaseModel]) -> dict[str, str]:
    schemas[model.__name__] = model.model_json_schema(ref_template=REF)
    return _ref(model.__name__)


def _components() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    _derived(schemas, StopRecord, {"cleared": {"title": "Cleared", "type": "boolean"}})
    _derived(schemas, Change)
    _derived(schemas, AuditRecord)
    _derived(schemas, VerifyResult)
    _derived(schemas, RunRecord)  # tools, a tuple, is written as a JSON list (runs.run_json)
    _derived(schemas, Checkpoint)
    _derived(schemas, Grant)
    _derived(schemas, CredentialRecord)
    _derived(schemas, Intent)
    # The ``error`` object of every error body, and of each refused run in a batched renewal.
    # Optional fields: who may (403), and which stop refused a lease (409 stopped).
    schemas["ErrorObject"] = {
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "retryable": {"type": "boolean"},
            "needed_roles": {"type": "array", "items": {"type": "string"}},
            "scope": {"type": "string"},
            "stop_id": {"type": "string"},
            "reason": {"type": "string"},
        },
        "required": ["code", "message", "retryable"],
        "additionalProperties": False,
    }
    schemas["Error"] = _closed({"type": "object", "properties": {"error": _ref("ErrorObject")}})
    schemas["StopList"] = _closed({"type": "object", "properties": {"stops": _array(_ref("StopRecord"))}})
    schemas["AuditList"] = _closed({"type": "object", "properties": {"records": _array(_ref("AuditRecord"))}})
    schemas["IntentList"] = _closed({"type": "object", "properties": {"intents": _array(_ref("Intent"))}})
    schemas["RunList"] = _closed({"type": "object", "properties": {"runs": _array(_ref("RunRecord"))}})
    schemas["Registration"] = _closed(
        {
            "type": "object",
            "properties": {
                "run": _ref("RunRecord"),
                "lease": _ref("Grant"),
                "checkpoint": {"anyOf": [_ref("Checkpoint"), {"type": "null"}]},
            },
        }
    )
    schemas["Renewals"] = _closed(
        {
            "type": "object",
            "properties": {
                "leases": {"type": "object", "additionalProperties": _ref("Grant")},
                "refused": {"type": "object", "additionalProperties": _ref("ErrorObject")},
            },
        }
    )
    # The credential broker: an issued credential (the map's row plus the token, less run_id),
    # the map of a run, and the JWKS.
    number, text = {"type": "number"}, {"type": "string"}
    schemas["Credential"] = _closed(
        {
            "type": "object",
            "properties": {
                "token": text,
                "jti": text,
                "audience": text,
                "issued_at": number,
                "expires_at": number,
                "kid": text,
            },
        }
    )
    schemas["CredentialList"] = _closed(
        {"type": "object", "properties": {"credentials": _array(_ref("CredentialRecord"))}}
    )
    schemas["Jwk"] = _closed(
        {
            "type": "object",
            "properties": {
                "kty": {"const": "OKP"},
                "crv": {"const": "Ed25519"},
                "x": text,
                "kid": text,
                "alg": {"const": "EdDSA"},
                "use": {"const": "sig"},
            },
        }
    )
    schemas["Jwks"] = _closed({"type": "object", "properties": {"keys": _array(_ref("Jwk"))}})
    schemas["Health"] = _closed(
        {"type": "object", "properties": {"ok": {"const": True}, "revision": {"type": "integer"}}}
    )
    return {
        "schemas": schemas,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    }


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


#: The meanings shared by every operation; 404, 409 and others are described per operation.
_ERRORS = {
    401: "unauthenticated: no, malformed or unknown bearer token",
    403: "forbidden: the caller's role may not do this (needed_roles lists who may)",
    422: "invalid_request: the body or a parameter is invalid",
    501: "leases_not_configured: this control plane has no [leases] keys",
    503: "registry_unavailable: the stop registry, run store or audit log failed (fail closed; retryable)",
}
_FORBIDDEN_RUN = (
    "forbidden: the caller's role may not do this (needed_roles lists who may), or the run is another agent's"
)
_UNKNOWN_RUN = "unknown_run: no run has this id"
_STOPPED = "stopped: an active stop matches one of the run's scopes (scope, stop_id and reason say which)"


#: ``Scope.parse``'s grammar (scope.py), so generated bodies mostly name real scopes.
SCOPE_PATTERN = (
    rf"^(global|({'|'.join(k for k in KINDS if k not in ('global', 'version'))}):\S(.*\S)?"
    r"|version:[^@\s][^@]*@.*\S)$"
)

#: A stop just issued can be cleared: schemathesis' stateful phase follows this link.
_CLEAR_LINK = {"clear": {"operationId": "clear_stop", "parameters": {"stop_id": "$response.body#/stop_id"}}}

#: A run just registered can be read, renewed, checkpointed, reported and ended through these links.
_RUN_LINKS = {
    operation_id: {"operationId": operation_id, "parameters": {"run_id": "$response.body#/run/run_id"}}
    for operation_id in (
        "get_run",
        "renew_lease",
        "save_checkpoint",
        "latest_checkpoint",
        "end_run",
        "issue_credential",
        "list_credentials",
        "run_report",
    )
}

Errors = tuple[int | tuple[int, str], ...]


def _operation(
    operation_id: str,
    summary: str,
    ok: tuple[int, dict[str, Any]],
    errors: Errors,
    action: str | None,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One operation; ``action`` is its ``ROLES`` key, or None for an unauthenticated one.

    ``errors`` are status codes with the shared meaning in ``_ERRORS``, or (code, meaning) for
    this operation's own: a 404 or a 409 means different things on different paths.
    """

    meanings = {c: _ERRORS[c] for c in errors if isinstance(c, int)}
    meanings.update(c for c in errors if not isinstance(c, int))
    if action is not None:
        meanings.setdefault(401, _ERRORS[401])
        if ROLES[action] != frozenset(get_args(Role)):
            meanings.setdefault(403, _ERRORS[403])
    responses: dict[str, Any] = {str(ok[0]): ok[1]}
    responses.update({str(c): _json(meanings[c], _ref("Error")) for c in sorted(meanings)})
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": responses}
    if action is None:
        operation["security"] = []
    else:
        operation["description"] = f"Roles: {', '.join(sorted(ROLES[action]))}."
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    return operation


def _query(name: str, schema: dict[str, Any], description: str, where: str = "query") -> dict[str, Any]:
    return {"name": name, "in": where, "required": False, "schema": schema, "description": description}


def _watch_event() -> dict[str, Any]:
    """One server-sent event: a registry change, or an ``error`` event before the stream ends."""

    def event(kind: dict[str, Any], data: dict[str, Any], with_id: bool) -> dict[str, Any]:
        properties = {
            "event": kind,
            "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
        }
        if with_id:
            properties["id"] = {"type": "string", "pattern": "^[0-9]+$"}
        return {"type": "object", "properties": properties, "required": list(properties)}

    change = event({"enum": list(get_args(ChangeKind))}, _ref("Change"), True)
    failure = event(
        {"const": "error"},
        {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
        False,
    )
    return {"oneOf": [change, failure]}


def _run_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """The run and lease endpoints (haltwire.control.runs)."""

    run_id = [
        {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": RUN_ID}}
    ]
    not_yours = (403, _FORBIDDEN_RUN)
    unknown = (404, _UNKNOWN_RUN)
    registered = _json("the run, its first lease and the checkpoint it resumes from", _ref("Registration"))
    return {
        "/v1/runs": {
            "post": _operation(
                "register_run",
                "Register a run and grant its first lease",
                (201, {**registered, "links": _RUN_LINKS}),
                (
                    (
                        409,
                        "run_exists: a run with this id was registered before; "
                        f"or {_STOPPED} (nothing is recorded)",
                    ),
                    (
                        422,
                        "invalid_request: the body is invalid, the agent_class unknown, "
                        "or resume_from not a run of this agent",
                    ),
                    501,
                    503,
                ),
                "run.register",
                body=_body_schema(schemas, RegisterBody),
            ),
            "get": _operation(
                "list_runs",
                "The most recently registered runs, newest first",
                (200, _json("the runs", _ref("RunList"))),
                ((422, f"invalid_request: limit is not a number from 1 to {MAX_BATCH}"), 503),
                "runs.list",
                [
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_BATCH, "default": 100},
                        "how many runs",
                    )
                ],
            ),
        },
        "/v1/runs/{run_id}": {
            "get": _operation(
                "get_run",
                "One run",
                (200, _json("the run", _ref("RunRecord"))),
                (not_yours, unknown, 503),
                "run.read",
                run_id,
            )
        },
        "/v1/runs/{run_id}/lease": {
            "post": _operation(
                "renew_lease",
                "Renew a run's lease",
                (200, _json("the new lease", _ref("Grant"))),
                (
                    not_yours,
                    unknown,
                    (409, f"{_STOPPED}; or run_ended: the run has ended and gets no more leases"),
                    501,
                    503,
                ),
                "lease.renew",
                run_id,
            )
        },
        "/v1/runs/{run_id}/end": {
            "post": _operation(
                "end_run",
                "End a run: it gets no more leases",
                (200, _json("the run, ended_at set (by the first end)", _ref("RunRecord"))),
                (not_yours, unknown, 503),
                "run.end",
                run_id,
            )
        },
        "/v1/runs/{run_id}/checkpoint": {
            "put": _operation(
                "save_checkpoint",
                "Save a run's next checkpoint",
                (200, _json("the checkpoint saved", _ref("Checkpoint"))),
                (
                    not_yours,
                    unknown,
                    (413, f"payload_too_large: the body is over {MAX_CHECKPOINT_BYTES} bytes"),
                    422,
                    503,
                ),
                "checkpoint.save",
                run_id,
                body=_body_schema(schemas, CheckpointBody),
            ),
            "get": _operation(
                "latest_checkpoint",
                "A run's latest checkpoint",
                (200, _json("the latest checkpoint", _ref("Checkpoint"))),
                (
                    not_yours,
                    (404, f"{_UNKNOWN_RUN}; or no_checkpoint: the run has saved no checkpoint"),
                    503,
                ),
                "checkpoint.read",
                run_id,
            ),
        },
        "/v1/leases/renew": {
            "post": _operation(
                "renew_leases",
                "Renew many runs' leases in one request",
                (200, _json("a lease for each run granted one, an error for each refused", _ref("Renewals"))),
                (422, 501, 503),
                "lease.renew",
                body=_body_schema(schemas, RenewBody),
            )
        },
    }


def _broker_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """The credential broker's endpoints (haltwire.control.broker)."""

    run_id = [
        {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": RUN_ID}}
    ]
    not_configured = (501, "broker_not_configured: this control plane has no [broker]")
    return {
        "/v1/runs/{run_id}/credentials": {
            "post": _operation(
                "issue_credential",
                "Issue a short-lived credential for one of the run's downstream systems",
                (
                    201,
                    _json("the credential (a JWT signed with EdDSA) and its map entry", _ref("Credential")),
                ),
                (
                    (403, _FORBIDDEN_RUN),
                    (404, _UNKNOWN_RUN),
                    (409, f"{_STOPPED}; or run_ended: the run has ended and gets no more credentials"),
                    (422, "invalid_request: the body is invalid or the audience is not configured"),
                    not_configured,
                    503,
                ),
                "credential.issue",
                run_id,
                body=_body_schema(schemas, CredentialBody),
            ),
            "get": _operation(
                "list_credentials",
                "The credential map of a run: every credential issued to it (never the tokens)",
                (200, _json("the credentials, oldest first", _ref("CredentialList"))),
                ((403, _FORBIDDEN_RUN), (404, _UNKNOWN_RUN), 503),
                "credentials.read",
                run_id,
            ),
        },
        JWKS_PATH: {
            "get": _operation(
                "jwks",
                "The broker's public keys, to verify credentials with (every stop revokes "
                "the credentials issued before it on its scope: follow /v1/watch)",
                (200, _json("the JWKS", _ref("Jwks"))),
                (not_configured,),
                None,
            )
        },
    }


def _intent_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """The intent endpoints (haltwire.control.intents)."""

    intent_id = [{"name": "intent_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    unknown = (404, "unknown_intent: no intent has this id")
    transition = (
        409,
        "invalid_transition: the intent's state does not allow this, or another executor claimed it",
    )
    one = _json("the intent", _ref("Intent"))
    listed = _json("the intents, oldest first", _ref("IntentList"))

    def settle(operation_id: str, summary: str, action: str, body: type[BaseModel] | None) -> dict[str, Any]:
        return _operation(
            operation_id,
            summary,
            (200, one),
            (unknown, transition, *((422,) if body else ()), 503),
            action,
            intent_id,
            body=None if body is None else _body_schema(schemas, body),
        )

    create = _operation(
        "create_intent",
        "Record an intent to call an irreversible tool (the executor performs it)",
        (
            201,
            _json(
                "the intent recorded (cancelled at once if a stop landed while it was recorded)",
                _ref("Intent"),
            ),
        ),
        (
            (
                409,
                "idempotency_conflict: the key was used for another tool or other arguments; "
                "or stopped: an active stop matches one of the intent's scopes (scope, stop_id "
                "and reason say which; nothing is recorded)",
            ),
            422,
            503,
        ),
        "intent.create",
        body=_body_schema(schemas, IntentBody),
    )
    # Answers that are not errors: the intent recorded first for a repeated key, and no content.
    create["responses"]["200"] = _json(
        "a repeated idempotency key: the intent recorded first", _ref("Intent")
    )
    claim = _operation(
        "claim_intent",
        "Claim the oldest pending intent for the calling executor",
        (200, one),
        (503,),
        "intent.claim",
    )
    claim["responses"]["204"] = {"description": "no intent is pending"}

    return {
        "/v1/intents": {
            "post": create,
            "get": _operation(
                "list_intents",
                "Intents, oldest first, of one run and/or in some states",
                (200, listed),
                (
                    (
                        422,
                        f"invalid_request: limit is not a number from 1 to {MAX_BATCH}, or a state unknown",
                    ),
                    503,
                ),
                "intents.list",
                [
                    _query("run", {"type": "string"}, "only this run's intents"),
                    _query(
                        "state",
                        {"enum": list(STATES)},
                        "only intents in this state (repeat it, or separate states by commas, for several)",
                    ),
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_BATCH, "default": 100},
                        "how many intents",
                    ),
                ],
            ),
        },
        "/v1/intents/claim": {"post": claim},
        "/v1/intents/unknown": {
            "post": _operation(
                "mark_unknown",
                "After an executor's restart: every intent it had claimed becomes unknown",
                (200, _json("the intents now unknown", _ref("IntentList"))),
                (503,),
                "intent.unknown",
            )
        },
        "/v1/intents/{intent_id}": {
            "get": _operation(
                "get_intent",
                "One intent",
                (200, one),
                (
                    (
                        403,
                        "forbidden: the caller's role may not do this (needed_roles lists who may), "
                        "or the intent is another agent's",
                    ),
                    unknown,
                    503,
                ),
                "intent.read",
                intent_id,
            )
        },
        "/v1/intents/{intent_id}/check": {
            "post": _operation(
                "check_intent",
                "The executor's final registry check before it performs a claimed intent's call",
                (
                    200,
                    _json("no stop matches: checked_revision records the revision checked", _ref("Intent")),
                ),
                (
                    unknown,
                    (
                        409,
                        "stopped: a stop matches the intent (or its run reached a per-run intent "
                        "limit, which wrote one); the intent is now cancelled (error.intent); or "
                        "invalid_transition",
                    ),
                    503,
                ),
                "intent.check",
                intent_id,
            )
        },
        "/v1/intents/{intent_id}/commit": {
            "post": settle("commit_intent", "Record a claimed intent's outcome", "intent.commit", CommitBody)
        },
        "/v1/intents/{intent_id}/fail": {
            "post": settle(
                "fail_intent", "Record that a claimed intent's call failed", "intent.fail", FailBody
            )
        },
        "/v1/intents/{intent_id}/approve": {
            "post": settle("approve_intent", "Approve an intent awaiting approval", "intent.approve", None)
        },
        "/v1/intents/{intent_id}/reject": {
            "post": settle("reject_intent", "Reject an intent awaiting approval", "intent.reject", RejectBody)
        },
    }


def _report_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """The run report (haltwire.control.reports); its schema is derived from ``RunReport``."""

    _derived(schemas, TimelineEntry)
    _derived(schemas, RunReport)  # its run, intents and stops refer to the schemas above
    run_id = [
        {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": RUN_ID}}
    ]
    return {
        "/v1/runs/{run_id}/report": {
            "get": _operation(
                "run_report",
                "What a run did: its intents by state, the stops that hit it and its audit timeline",
                (200, _json("the report", _ref("RunReport"))),
                ((403, _FORBIDDEN_RUN), (404, _UNKNOWN_RUN), 503),
                "run.report",
                run_id,
            )
        }
    }


def _document() -> dict[str, Any]:

    components = _components()
    schemas = components["schemas"]
    issue_body = _body_schema(schemas, IssueBody)
    schemas["IssueBody"]["properties"]["scope"].update(
        pattern=SCOPE_PATTERN,
        description="run:ID, tenant:ID, tool:NAME, agent:ID, version:AGENT@VERSION or global",
    )
    revision = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}  # the stores' 64-bit column
    watch_ok = {
        "description": "Server-sent events: each registry change after the revision (the event id is its "
        "revision), with heartbeat comments; an `error` event ends the stream if the registry fails",
        "content": {"text/event-stream": {"schema": _watch_event()}},
    }
    paths: dict[str, Any] = {
        "/healthz": {
            "get": _operation(
                "healthz",
                "Liveness and the registry's revision",
                (200, _json("ok", _ref("Health"))),
                (503,),
                None,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "openapi_json",
                "This document",
                (200, _json("the OpenAPI document", {"type": "object"})),
                (),
                None,
            )
        },
        "/v1/stops": {
            "post": _operation(
                "issue_stop",
                "Issue a stop",
                (201, {**_json("the stop issued", _ref("StopRecord")), "links": _CLEAR_LINK}),
                (422, 503),
                "stop.issue",
                body=issue_body,
            ),
            "get": _operation(
                "list_stops",
                "Active stops (all stops ever with all=1), as visible to the caller",
                (200, _json("the stops", _ref("StopList"))),
                (503,),
                "stops.read",
                [_query("all", {"type": "string"}, "1, true or yes: every stop, cleared and expired too")],
            ),
        },
        "/v1/stops/{stop_id}/clear": {
            "post": _operation(
                "clear_stop",
                "Clear a stop",
                (200, _json("the stop as cleared", _ref("StopRecord"))),
                (
                    (404, "unknown_stop: no stop has this id"),
                    (409, "already_cleared: the stop was cleared before"),
                    422,
                    503,
                ),
                "stop.clear",
                [{"name": "stop_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                body=_body_schema(schemas, ClearBody),
            )
        },
        "/v1/audit": {
            "get": _operation(
                "list_audit",
                "The audit log, oldest first",
                (200, _json("the records", _ref("AuditList"))),
                (503,),
                "audit.read",
                [_query("target", {"type": "string"}, "only records about this target (a stop id, a scope)")],
            )
        },
        "/v1/audit/verify": {
            "get": _operation(
                "verify_audit",
                "Check the audit log's hash chain",
                (200, _json("the result", _ref("VerifyResult"))),
                (503,),
                "audit.read",
            )
        },
        "/v1/watch": {
            "get": _operation(
                "watch",
                "Watch registry changes after a revision",
                (200, watch_ok),
                (422, 503),
                "watch",
                [
                    _query("since", revision, "the last revision seen (default 0: from the start)"),
                    _query("Last-Event-ID", revision, "a reconnecting client's last event id", "header"),
                ],
            )
        },
        **_run_paths(schemas),
        **_broker_paths(schemas),
        **_intent_paths(schemas),
        **_report_paths(schemas),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "haltwire control plane", "version": getattr(haltwire, "__version__", "0")},
        "security": [{"bearer": []}],
        "paths": paths,
        "components": components,
    }


@functools.cache
def document() -> dict[str, Any]:
    """The document, built once (it depends on code only, not on configuration)."""
    return _document()


async def openapi_json(request: Request) -> Response:
    return JSONResponse(document())
