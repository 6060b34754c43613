"""The fields of the control plane's requests, bounded as ``haltwire.limits`` says.

Each type is a ``str`` to the handlers (``Time`` a ``float``), checked by pydantic as a body is
parsed, and written into the OpenAPI document with its length and a pattern of the characters it
takes (a time with its range). A value
past a limit is refused by what it breaks, never quoted (``wire.parse_body``).
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from fastapi import Path
from pydantic import AfterValidator, Field

from haltwire.limits import (
    ID_PATTERN,
    MAX_ID_CHARS,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TIME_S,
    PRINTABLE_PATTERN,
    TEXT_PATTERN,
    has_control_characters,
)

_ID: Final = re.compile(ID_PATTERN.removeprefix("^").removesuffix("$"))
ID_RULE: Final = f"an id is 1 to {MAX_ID_CHARS} characters: letters, digits, _ . : -"


def is_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def _id(value: str) -> str:
    if not is_id(value):
        raise ValueError(ID_RULE)
    return value


def _printable(value: str) -> str:
    if has_control_characters(value):
        raise ValueError("may not hold control characters")
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("may not be blank")
    if has_control_characters(value, allowed="\n\t"):
        raise ValueError("may not hold control characters (newline and tab are fine)")
    return value


#: A run, stop or intent id (a run's may be its agent's choice).
Id = Annotated[str, Field(json_schema_extra={"pattern": ID_PATTERN}), AfterValidator(_id)]
#: The same in a path: FastAPI documents it, ``wire.caller`` checks it.
IdPath = Annotated[str, Path(json_schema_extra={"pattern": ID_PATTERN})]
#: An agent id, tenant, version, tool name, agent class or audience: one printable line.
Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS, json_schema_extra={"pattern": PRINTABLE_PATTERN}),
    AfterValidator(_printable),
]
#: An idempotency key.
Key = Annotated[
    str,
    Field(min_length=1, max_length=MAX_KEY_CHARS, json_schema_extra={"pattern": PRINTABLE_PATTERN}),
    AfterValidator(_printable),
]
#: A reason (a stop's, a clear's, a rejection's) or an error: a few printable lines.
Text = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REASON_CHARS, json_schema_extra={"pattern": TEXT_PATTERN}),
    AfterValidator(_text),
]

#: A time in Unix seconds: a finite number from 0 to ``MAX_TIME_S``.
Time = Annotated[float, Field(ge=0, le=MAX_TIME_S, allow_inf_nan=False)]
