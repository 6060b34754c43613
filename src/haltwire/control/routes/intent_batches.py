"""Routes of intents in batches (executor): claim, check and settle many intents in one write.

``POST /v1/intent-turns`` is the three in one: an executor's turn settles the calls its
workers made, then claims and checks their next intents (``intent_batches.turn_batch``).

The batch forms of ``POST /v1/intents/claim``, ``/v1/intents/{id}/check`` and ``/commit`` /
``/fail``, with the same roles (their actions), the same per-intent rules and audit records
(``haltwire.control.intent_batches``). One intent's refusal is its own entry of the answer,
with the status and error body its one-at-a-time route would have answered.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from haltwire.control import intent_batches
from haltwire.control.access import authorize
from haltwire.control.intent_batches import MAX_BATCH, Answer, Outcome
from haltwire.control.routes.fields import Id, Text
from haltwire.control.routes.views import ErrorObject, IntentList, intents_json
from haltwire.control.routes.wire import Body, BodyLimit, Route, body, caller, plane_of
from haltwire.intents import Intent


class ClaimsBody(Body):
    #: The most intents to claim (fewer, or none, when fewer are pending).
    limit: int = Field(ge=1, le=MAX_BATCH)


class ChecksBody(Body):
    intent_ids: list[Id] = Field(min_length=1, max_length=MAX_BATCH)


class OutcomeEntry(Body):
    """One intent's outcome: ``outcome`` (the tool's result: commit) or ``error`` (fail)."""

    intent_id: Id
    outcome: dict[str, Any] | None = None
    error: Text | None = None

    @model_validator(mode="after")
    def one_of(self) -> Self:
        if (self.outcome is None) == (self.error is None):
            raise ValueError("an outcome has either outcome (commit) or error (fail)")
        return self


class OutcomesBody(Body):
    #: The tools' results, which nothing before bounds.
    body_limit: ClassVar[BodyLimit] = "max_intent_body_bytes"

    outcomes: list[OutcomeEntry] = Field(min_length=1, max_length=MAX_BATCH)


class TurnBody(Body):
    """An executor's turn: the outcomes of the calls its workers made (none on a first turn),
    and how many more intents to claim and check for workers about to perform them."""

    body_limit: ClassVar[BodyLimit] = "max_intent_body_bytes"

    outcomes: list[OutcomeEntry] = Field(default_factory=list, max_length=MAX_BATCH)
    #: The most intents to claim and check now (0: only settle).
    claim: int = Field(ge=0, le=MAX_BATCH)


class IntentAnswer(TypedDict):
    """One intent of a batch: ``status`` 200 with the intent (``error`` null), or the status and
    error its own route would have answered (404 ``unknown_intent``, 409 ``stopped`` or
    ``invalid_transition``; ``intent`` null)."""

    intent_id: str
    status: Literal[200, 404, 409]
    intent: Intent | None
    error: ErrorObject | None


class IntentAnswers(TypedDict):
    results: list[IntentAnswer]


class TurnAnswers(TypedDict):
    #: The outcomes' answers, in the order given.
    results: list[IntentAnswer]
    #: The intents claimed and checked, oldest first: each checked (200), or cancelled by a
    #: stop (409 ``stopped``) and not to be performed.
    intents: list[IntentAnswer]


def _answers(answers: list[Answer]) -> Response:
    return JSONResponse({"results": [a.json() for a in answers]})


async def claim_intents(request: Request) -> Response:
    """Claim up to limit of the oldest pending intents for the calling executor, in one write"""
    who = await caller(request, "intent.claim", write=True)
    asked = await body(request, who, ClaimsBody, "intent.claim")
    return JSONResponse(intents_json(await intent_batches.claim_batch(plane_of(request), who, asked.limit)))


async def check_intents(request: Request) -> Response:
    """The final registry checks of several claimed intents, in one write, each right before its call"""
    who = await caller(request, "intent.check", write=True)
    asked = await body(request, who, ChecksBody, "intent.check")
    return _answers(await intent_batches.check_batch(plane_of(request), who, asked.intent_ids))


async def settle_intents(request: Request) -> Response:
    """Record the outcomes of several claimed intents (commit or fail each), in one write"""
    who = await caller(request, "intent.commit", write=True)
    asked = await body(request, who, OutcomesBody, "intent.commit")
    outcomes = [Outcome(o.intent_id, o.outcome, o.error) for o in asked.outcomes]
    return _answers(await intent_batches.settle_batch(plane_of(request), who, outcomes))


async def take_turn(request: Request) -> Response:
    """Record the outcomes of an executor's calls, then claim and check its next intents, in one write"""
    who = await caller(request, "intent.claim", write=True)
    for action in ("intent.check", "intent.commit"):
        await authorize(plane_of(request), who, action, write=True)
    asked = await body(request, who, TurnBody, "intent.claim")
    outcomes = [Outcome(o.intent_id, o.outcome, o.error) for o in asked.outcomes]
    settled, claimed = await intent_batches.turn_batch(plane_of(request), who, outcomes, asked.claim)
    return JSONResponse({"results": [a.json() for a in settled], "intents": [a.json() for a in claimed]})


_EACH = "each intent's own refusal is its entry of results (status and error)"

routes = [
    Route(
        "POST",
        "/v1/intent-batches/claim",
        claim_intents,
        "intent.claim",
        (200, IntentList, "the intents claimed, oldest first (none when nothing is pending)"),
        (422, 503),
        body=ClaimsBody,
    ),
    Route(
        "POST",
        "/v1/intent-batches/check",
        check_intents,
        "intent.check",
        (
            200,
            IntentAnswers,
            f"in the order asked; {_EACH}, as POST /v1/intents/{{intent_id}}/check answers it",
        ),
        (422, 503),
        body=ChecksBody,
    ),
    Route(
        "POST",
        "/v1/intent-batches/settle",
        settle_intents,
        "intent.commit",
        (
            200,
            IntentAnswers,
            f"in the order given; {_EACH}, as POST /v1/intents/{{intent_id}}/commit answers it",
        ),
        (422, 503),
        body=OutcomesBody,
    ),
    Route(
        "POST",
        "/v1/intent-turns",
        take_turn,
        "intent.claim",
        (
            200,
            TurnAnswers,
            f"the outcomes in the order given, then the intents claimed and checked; {_EACH}",
        ),
        (422, 503),
        body=TurnBody,
    ),
]
