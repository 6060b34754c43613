"""What every control-plane route shares on the wire: the caller, request bodies, error answers.

A route authenticates and authorizes its caller (``caller``), parses its body (``parse_body``:
a pydantic model that forbids unknown keys; a bad one is 422 ``invalid_request`` naming each
problem), calls one rule and writes its answer. Every refusal a rule raises is ``Refused``,
answered as ``{"error": {"code", "message", "retryable", ...}}`` (``answer``).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from haltwire.control.access import authenticate, authorize
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, invalid
from haltwire.control.plane import Plane


class Body(BaseModel):
    """A request body: unknown keys are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


BodyT = TypeVar("BodyT", bound=Body)


def plane_of(request: Request) -> Plane:
    plane: Plane = request.app.state.plane
    return plane


async def caller(request: Request, action: str, target: str = "", write: bool = False) -> Caller:
    """The request's caller, if its role may take ``action`` (a refused write is audited)."""
    plane = plane_of(request)
    who = authenticate(plane, request.headers.get("authorization"))
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
    """The request's JSON body as ``model``, or ``Refused`` 422 naming every problem."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise invalid(problems) from None


def query_limit(request: Request, default: int = 100, most: int = 1000) -> int:
    """The ``?limit=`` of a list request, from 1 to ``most``; ``Refused`` 422 otherwise."""
    text = request.query_params.get("limit", str(default))
    try:
        limit = int(text)
    except ValueError:
        raise invalid(f"limit must be a number, not {text!r}") from None
    if not 1 <= limit <= most:
        raise invalid(f"limit must be from 1 to {most}")
    return limit


def answer(refused: Refused) -> JSONResponse:
    return JSONResponse({"error": refused.error()}, status_code=refused.status)
