"""What every control-plane endpoint shares on the wire: request bodies and error answers.

A body is a pydantic model that forbids unknown keys; a bad one is 422 ``invalid_request``
naming each problem. Any refusal is ``Refused``, answered as ``{"error": {"code", "message",
"retryable", ...}}`` (retryable only for 503).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse


class Refused(Exception):
    """An HTTP error answered as ``{"error": {...}}``."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    def response(self) -> JSONResponse:
        error = {"code": self.code, "message": self.message, "retryable": self.status == 503, **self.extra}
        return JSONResponse({"error": error}, status_code=self.status)


class Body(BaseModel):
    """A request body: unknown keys are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


BodyT = TypeVar("BodyT", bound=Body)


async def parse_body(request: Request, model: type[BodyT]) -> BodyT:
    """The request's JSON body as ``model``, or ``Refused`` 422 naming every problem."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise Refused(422, "invalid_request", problems) from None


def query_limit(request: Request, default: int = 100, most: int = 1000) -> int:
    """The ``?limit=`` of a list request, from 1 to ``most``; ``Refused`` 422 otherwise."""
    text = request.query_params.get("limit", str(default))
    try:
        limit = int(text)
    except ValueError:
        raise Refused(422, "invalid_request", f"limit must be a number, not {text!r}") from None
    if not 1 <= limit <= most:
        raise Refused(422, "invalid_request", f"limit must be from 1 to {most}")
    return limit
