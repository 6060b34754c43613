"""What every control-plane route shares on the wire: its declaration, the caller, request
bodies, error answers.

A route (``Route``: a FastAPI route and its operation in the OpenAPI document) authenticates
and authorizes its caller (``caller``: the path's ids checked too), parses its body
(``parse_body``: a pydantic model that forbids unknown keys; a bad one is 422
``invalid_request`` naming each problem), calls one rule and writes its answer. Every refusal a
rule raises is ``Refused``, answered as ``{"error": {"code", "message", "retryable", ...}}``
(``answer``).

Limits (``haltwire.limits``): a body past ``[control] max_body_bytes`` (or, for a body model
that says so, ``max_intent_body_bytes``) is 413 ``payload_too_large``, known from its
Content-Length before it is read or counted as it streams in; a route without a body refuses
a Content-Length past ``max_body_bytes`` before anything else. Fields are bounded by the
types of ``fields`` (``Id``, ``Name``, ``Key``, ``Text``), and no refusal quotes more of a value than
``limits.shown`` does.

FastAPI validates nothing here. It would decode a body before the caller is known and answer
its own 422, unaudited: a body model is in the document only, and the handler parses it after
authorizing. A path parameter is any string; the query is read by the handler. So a route
calls its handler itself, with the request and the path's parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, Final, Literal, TypeVar, get_args

from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.json_schema import JsonSchemaMode
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from haltwire import jsonwire
from haltwire.control.access import ROLES, authenticate, authorize
from haltwire.control.config import Caller, Role
from haltwire.control.errors import Refused, invalid
from haltwire.control.plane import Plane
from haltwire.control.routes.fields import ID_RULE, is_id
from haltwire.control.routes.views import Error
from haltwire.limits import MAX_BODY_BYTES, MAX_INTENT_BODY_BYTES, shown

JSON: Final = "application/json"
REF: Final = "#/components/schemas/{model}"

#: The meanings shared by every operation; 404, 409 and others are described per operation.
ERRORS: Final = {
    401: "unauthenticated: no, malformed or unknown bearer token",
    403: "forbidden: the caller's role may not do this (needed_roles lists who may)",
    422: "invalid_request: the body or a parameter is invalid",
    501: "leases_not_configured: this control plane has no [leases] keys",
    503: "registry_unavailable: the stop registry, run store or audit log failed (fail closed; retryable)",
}
FORBIDDEN_RUN: Final = (403, ERRORS[403] + ", or the run is another agent's of the caller's tenant")
#: Another tenant's run answers as one that does not exist (``access.ownership``).
UNKNOWN_RUN: Final = (404, "unknown_run: no run has this id (or, to an agent, another tenant's)")
STOPPED: Final = (
    "stopped: an active stop matches one of the run's scopes (scope, stop_id and reason say which)"
)

#: A status with its meaning in ``ERRORS``, or (status, meaning) for this operation's own.
Errors = Sequence[int | tuple[int, str]]
#: An answer: its status, its model (or, not JSON, its content by media type), what it is.
Answer = tuple[int, Any, str]


#: Which ``[control]`` key bounds a body.
BodyLimit = Literal["max_body_bytes", "max_intent_body_bytes"]
_DEFAULTS: Final[dict[str, int]] = {
    "max_body_bytes": MAX_BODY_BYTES,
    "max_intent_body_bytes": MAX_INTENT_BODY_BYTES,
}
#: The most problems one refusal lists (a body can have thousands).
_PROBLEMS: Final = 5


class Body(BaseModel):
    """A request body: unknown keys are an error, not ignored; at most ``body_limit`` bytes."""

    model_config = ConfigDict(extra="forbid")
    body_limit: ClassVar[BodyLimit] = "max_body_bytes"


BodyT = TypeVar("BodyT", bound=Body)


class Route(APIRoute):
    """One route, and its operation in the document.

    ``action`` is its ``ROLES`` key (401, and 403 unless every role may), or None for a route
    open to all. The handler's docstring is the summary, ``answer`` the success, ``also``
    other answers that are not errors; ``query`` the parameters the handler reads itself;
    ``refers`` records that a non-JSON answer's content names (the watch's ``Change``).
    """

    def __init__(
        self,
        method: str,
        path: str,
        endpoint: Callable[..., Awaitable[Response]],
        action: str | None,
        answer: Answer,
        errors: Errors = (),
        *,
        also: Sequence[Answer] = (),
        body: type[Body] | None = None,
        query: Sequence[dict[str, Any]] = (),
        links: dict[str, Any] | None = None,
        refers: Sequence[type] = (),
    ) -> None:
        #: What the document needs and FastAPI does not see: the body, the records ``content`` names.
        self.models: list[tuple[type, JsonSchemaMode]] = [(r, "serialization") for r in refers]
        if body is not None:
            self.models.append((body, "validation"))
        self.action = action
        #: None: no body is read, and one declared past ``max_body_bytes`` is refused at once.
        self.body_limit: BodyLimit | None = None if body is None else body.body_limit
        status, model, said = answer
        meanings = dict(c if isinstance(c, tuple) else (c, ERRORS[c]) for c in errors)
        limit = self.body_limit or "max_body_bytes"
        meanings.setdefault(
            413, f"payload_too_large: the body is over [control] {limit} ({_DEFAULTS[limit]} by default)"
        )
        if "{" in path:
            meanings.setdefault(422, f"invalid_request: {ID_RULE} in the path")
        extra: dict[str, Any] = {}
        if action is None:
            extra["security"] = []
        else:
            meanings.setdefault(401, ERRORS[401])
            if ROLES[action] != frozenset(get_args(Role)):
                meanings.setdefault(403, ERRORS[403])
        responses: dict[int | str, dict[str, Any]] = {
            code: {"model": Error, "description": meanings[code]} for code in sorted(meanings)
        }
        for code, other, description in also:
            responses[code] = {"description": description, **({"model": other} if other else {})}
        if isinstance(model, dict):  # another media type: FastAPI would say JSON
            responses[status] = {"description": said, "content": model}
        if links:
            responses.setdefault(status, {})["links"] = links
        if body is not None:
            schema = {"$ref": REF.format(model=body.__name__)}
            extra["requestBody"] = {"required": True, "content": {JSON: {"schema": schema}}}
        if query:
            extra["parameters"] = list(query)
        super().__init__(
            path,
            endpoint,
            methods=[method],
            operation_id=endpoint.__name__,
            summary=" ".join((inspect.getdoc(endpoint) or "").split()),
            status_code=status,
            response_model=None if isinstance(model, dict) else model,
            response_class=Response if isinstance(model, dict) else JSONResponse,
            response_description=said,
            responses=responses,
            openapi_extra=extra,
        )
        # Not the docstring again (FastAPI's default): who may call it.
        self.description = "" if action is None else f"Roles: {', '.join(sorted(ROLES[action]))}."

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        # FastAPI's handler solves dependencies for every request (~70 µs here, a lease renewal's
        # hot path). Ours take only the request and the path's parameters, strings as matched.
        endpoint = self.endpoint
        if list(inspect.signature(endpoint).parameters) != ["request", *self.param_convertors]:
            raise TypeError(f"{endpoint.__name__} must take the request, then its path's parameters")

        if self.body_limit is not None:

            async def handler(request: Request) -> Response:
                response: Response = await endpoint(request, **request.path_params)
                return response

            return handler

        async def bodiless(request: Request) -> Response:
            # Nothing will read this body: refuse it before anything else, as an oversized one.
            declared = request.headers.get("content-length")
            if declared is not None and declared != "0":
                most = plane_of(request).config.control.max_body_bytes
                if _over(declared, most):
                    raise too_large(most)
            response: Response = await endpoint(request, **request.path_params)
            return response

        return bodiless


def query(name: str, schema: dict[str, Any], description: str, where: str = "query") -> dict[str, Any]:
    """A parameter the handler reads itself, for the document."""
    return {"name": name, "in": where, "required": False, "schema": schema, "description": description}


def plane_of(request: Request) -> Plane:
    plane: Plane = request.app.state.plane
    return plane


async def caller(request: Request, action: str, target: str = "", write: bool = False) -> Caller:
    """The request's caller, if its role may take ``action`` and the path's ids are ids (a
    refused write is audited)."""
    plane = plane_of(request)
    who = authenticate(plane, request.headers.get("authorization"))
    for name, value in request.path_params.items():
        if not is_id(value):
            problem = invalid(f"{name}: {ID_RULE}")
            if write:  # before authorize, which would audit the value as its target
                raise await plane.refuse(who, action, shown(value), problem)
            raise problem
    await authorize(plane, who, action, target, write)
    return who


async def body(request: Request, who: Caller, model: type[BodyT], action: str, target: str = "") -> BodyT:
    """The request's body as ``model``; a bad one is refused 422 and, being a refused write by a
    known caller, audited."""
    try:
        return await parse_body(request, model)
    except Refused as exc:
        raise await plane_of(request).refuse(who, action, target, exc) from None


async def parse_body(request: Request, model: type[BodyT]) -> BodyT:
    """The request's JSON body as ``model``: ``Refused`` 413 past its limit, 422 naming the
    first problems (the fields, and the limits they break; never the values)."""
    raw = await read_body(request, getattr(plane_of(request).config.control, model.body_limit))
    # The one strict parser first (``haltwire.jsonwire``): pydantic's reads NaN and 1e400 into any
    # untyped field, which no answer or store can write back as JSON. Then pydantic parses it
    # again for the model, with its own limits (nesting ~200 deep) and its words for other errors.
    try:
        jsonwire.loads(raw)
    except jsonwire.NotJson as exc:
        raise invalid(f"body: {exc}") from None
    except (ValueError, RecursionError):
        pass  # not JSON at all: pydantic says where, below
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        problems = [
            f"{'.'.join(shown(str(p)) for p in e['loc']) or 'body'}: {shown(e['msg'], 200)}"
            for e in errors[:_PROBLEMS]
        ]
        if len(errors) > _PROBLEMS:
            problems.append(f"and {len(errors) - _PROBLEMS} more")
        raise invalid("; ".join(problems)) from None


async def read_body(request: Request, most: int) -> bytes:
    """The body, or ``Refused`` 413 as soon as it is known to be over ``most`` bytes: from its
    Content-Length before any of it is read, else by counting what has arrived (chunked)."""
    declared = request.headers.get("content-length")
    if declared is not None and _over(declared, most):
        raise too_large(most)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            raise too_large(most)
        chunks.append(chunk)
    return b"".join(chunks)


def _over(declared: str, most: int) -> bool:
    # The server has checked that it is digits; int() of thousands of them would raise.
    return len(declared) > len(str(most)) or int(declared) > most


def too_large(most: int) -> Refused:
    return Refused(
        413, "payload_too_large", f"the request body is over the {most} bytes this endpoint accepts"
    )


def query_limit(request: Request, default: int = 100, most: int = 1000) -> int:
    """The ``?limit=`` of a list request, from 1 to ``most``; ``Refused`` 422 otherwise."""
    text = request.query_params.get("limit", str(default))
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(most)) and 1 <= int(text) <= most):
        raise invalid(f"limit: a number from 1 to {most}")
    return int(text)


def query_id(request: Request, name: str) -> str | None:
    """An id in the query (``?run=``), or None when it is not there; ``Refused`` 422 if not an id."""
    value = request.query_params.get(name) or None
    if value is not None and not is_id(value):
        raise invalid(f"{name}: {ID_RULE}")
    return value


def limit_query(most: int, what: str) -> dict[str, Any]:
    """``?limit=`` for the document."""
    schema = {"type": "integer", "minimum": 1, "maximum": most, "default": 100}
    return query("limit", schema, f"how many {what}")


def answer(refused: Refused) -> JSONResponse:
    return JSONResponse({"error": refused.error()}, status_code=refused.status)
