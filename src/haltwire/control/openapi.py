"""The control plane's OpenAPI 3.1 document, served at ``GET /openapi.json`` without a token.

Shapes are derived, not restated: request bodies from the pydantic models the handlers
validate with, responses from the dataclasses the handlers serialize (``StopRecord``,
``Change``, ``AuditRecord``, ``VerifyResult``), and which operations can answer 403 from
``ROLES``. Response objects are closed (``additionalProperties: false``, every field required,
as ``asdict`` always writes every field), so a field added to a record without the document
noticing fails the schemathesis run in tests/test_openapi.py.
"""

from __future__ import annotations

import functools
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import haltwire
from haltwire.control.config import Role
from haltwire.scope import KINDS
from haltwire.store.audit import AuditRecord, VerifyResult
from haltwire.store.registry import Change, ChangeKind, StopRecord

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
    schemas["Error"] = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "retryable": {"type": "boolean"},
                    "needed_roles": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["code", "message", "retryable"],
                "additionalProperties": False,
            }
        },
        "required": ["error"],
        "additionalProperties": False,
    }
    schemas["StopList"] = _closed({"type": "object", "properties": {"stops": _array(_ref("StopRecord"))}})
    schemas["AuditList"] = _closed({"type": "object", "properties": {"records": _array(_ref("AuditRecord"))}})
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


_ERRORS = {
    401: "unauthenticated: no, malformed or unknown bearer token",
    403: "forbidden: the caller's role may not do this (needed_roles lists who may)",
    404: "unknown_stop: no stop has this id",
    409: "already_cleared: the stop was cleared before",
    422: "invalid_request: the body or a parameter is invalid",
    503: "registry_unavailable: the stop registry or audit log failed (fail closed; retryable)",
}


#: ``Scope.parse``'s grammar (scope.py), so generated bodies mostly name real scopes.
SCOPE_PATTERN = (
    rf"^(global|({'|'.join(k for k in KINDS if k not in ('global', 'version'))}):\S(.*\S)?"
    r"|version:[^@\s][^@]*@.*\S)$"
)

#: A stop just issued can be cleared: schemathesis' stateful phase follows this link.
_CLEAR_LINK = {"clear": {"operationId": "clear_stop", "parameters": {"stop_id": "$response.body#/stop_id"}}}


def _operation(
    operation_id: str,
    summary: str,
    ok: tuple[int, dict[str, Any]],
    errors: tuple[int, ...],
    action: str | None,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One operation; ``action`` is its ``ROLES`` key, or None for an unauthenticated one."""
    from haltwire.control.app import ROLES  # app.py imports this module for its route

    codes = list(errors)
    if action is not None:
        codes.append(401)
        if ROLES[action] != frozenset(get_args(Role)):
            codes.append(403)
    responses: dict[str, Any] = {str(ok[0]): ok[1]}
    responses.update({str(c): _json(_ERRORS[c], _ref("Error")) for c in sorted(codes)})
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


def _document() -> dict[str, Any]:
    from haltwire.control.app import ClearBody, IssueBody  # app.py imports this module for its route

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
                (404, 409, 422, 503),
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
