"""Intents claimed, checked and settled in batches: one durable write for many intents.

An executor with many workers asks for many intents at once. Each batch is one transaction
(one COMMIT, one fsync on SQLite) holding every intent's own write and its own audit record,
the same record the one-at-a-time route writes (with ``batch``: how many intents the write
held), so the audit chain, the run reports and the crash rules read as before:

- ``claim_batch``: up to ``limit`` of the oldest pending intents, claimed in one statement;
- ``check_batch``: each intent's final registry check, as ``intents.check`` makes it. The
  mirror catches up once, before the transaction; then, per intent in the order asked: a stop
  that matches cancels it (409 ``stopped``), else ``checked_revision`` is recorded. A stop
  issued meanwhile cancels the unchecked ones as it is written, so their check is refused
  (``invalid_transition``) and they are never performed. An intent whose run reaches a per-run
  limit (``[[intent_limits]]``) is checked alone after the batch commits, by ``intents.check``,
  which writes the limit's stop in a transaction of its own;
- ``settle_batch``: each outcome recorded, as ``intents.decide`` records a commit or a fail;
- ``turn_batch``: an executor's turn, all three in one transaction: the outcomes of the calls
  its workers made, then the next intents claimed and checked for workers that perform them at
  once (one request and one write per turn instead of three).

A refusal of one intent (unknown, not this executor's, a state that does not allow it) is that
intent's answer, audited in the same transaction; the others go on. A store failure rolls the
whole batch back (503): nothing of it is recorded, and the executor asks again.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Final

from haltwire.control import intents
from haltwire.control.config import Caller
from haltwire.control.errors import Refused, stopped_by
from haltwire.control.plane import Plane
from haltwire.control.stops import audit_cancelled
from haltwire.intents import Intent, IntentStateError, LimitReached, UnknownIntent, intent_fields

#: The most intents one batch request names (an executor has at most 64 workers).
MAX_BATCH: Final = 100


@dataclass(frozen=True, slots=True)
class Answer:
    """One intent's part of a batch's answer: the intent, or the refusal its own route answers."""

    intent_id: str
    intent: Intent | None = None
    refused: Refused | None = None

    def json(self) -> dict[str, Any]:
        if self.refused is None:
            assert self.intent is not None
            return {
                "intent_id": self.intent_id,
                "status": 200,
                "intent": intent_fields(self.intent),
                "error": None,
            }
        error = self.refused.error()
        return {"intent_id": self.intent_id, "status": self.refused.status, "intent": None, "error": error}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one executor reports of one intent: its result (commit) or its error (fail)."""

    intent_id: str
    result: dict[str, Any] | None = None
    error: str | None = None


async def claim_batch(plane: Plane, caller: Caller, limit: int) -> list[Intent]:
    """Up to ``limit`` of the oldest pending intents, claimed for the calling executor, oldest
    first; each audited ``intent.claim`` in the same transaction."""
    async with plane.transaction():
        claimed = await plane.open.intents.claim_many(caller.name, time.time(), limit)
        for intent in claimed:
            await plane.audit(
                caller,
                "intent.claim",
                intent.intent_id,
                "ok",
                "claimed",
                tool=intent.tool,
                batch=len(claimed),
            )
    return claimed


async def check_batch(plane: Plane, caller: Caller, intent_ids: list[str]) -> list[Answer]:
    """The final checks of ``intent_ids``, in that order (the module's docstring)."""
    revision = (await plane.catch_up()).stops.revision
    async with plane.transaction():
        answers, limited = await _checks(plane, caller, intent_ids, revision)
    return await _checked_alone(plane, caller, intent_ids, answers, limited)


async def turn_batch(
    plane: Plane, caller: Caller, outcomes: list[Outcome], limit: int
) -> tuple[list[Answer], list[Answer]]:
    """An executor's turn in one transaction: ``outcomes`` settled (as ``settle_batch``), then up
    to ``limit`` pending intents claimed (as ``claim_batch``) and checked (as ``check_batch``),
    each with its own audit records. A claimed intent is checked in the same write as its claim,
    for workers that perform it as soon as the answer comes: as close to the call as a check
    of its own. Answers the outcomes' answers and the claimed intents', oldest first."""
    async with plane.transaction():
        # Caught up inside: it writes no stop, and on SQLite no stop commits until it ends.
        revision = (await plane.catch_up()).stops.revision
        settled = await settle_batch(plane, caller, outcomes) if outcomes else []
        claimed = await claim_batch(plane, caller, limit) if limit else []
        ids = [intent.intent_id for intent in claimed]
        # Claimed in this transaction, so locked by it since: checked as the claim answered them.
        answers, limited = await _checks(plane, caller, ids, revision, {i.intent_id: i for i in claimed})
    return settled, await _checked_alone(plane, caller, ids, answers, limited)


async def _checks(
    plane: Plane, caller: Caller, intent_ids: list[str], revision: int, locked: dict[str, Intent] | None = None
) -> tuple[dict[str, Answer], list[str]]:
    """Each intent's check inside the caller's transaction, and those a per-run limit holds;
    ``locked``: intents this transaction has read under its lock already (not read again)."""
    answers: dict[str, Answer] = {}
    limited: list[str] = []
    n = len(intent_ids)
    for intent_id in intent_ids:
        try:
            current = (locked or {}).get(intent_id)
            answers[intent_id] = Answer(intent_id, await _check_one(plane, caller, intent_id, revision, n, current))
        except LimitReached:
            limited.append(intent_id)
        except Refused as exc:
            answers[intent_id] = Answer(
                intent_id, refused=await plane.refuse(caller, "intent.check", intent_id, exc)
            )
    return answers, limited


async def _checked_alone(
    plane: Plane, caller: Caller, intent_ids: list[str], answers: dict[str, Answer], limited: list[str]
) -> list[Answer]:
    """The answers in ``intent_ids``' order, the limited ones checked after the batch committed."""
    for intent_id in limited:  # the limit's stop is written in a transaction of its own
        try:
            answers[intent_id] = Answer(intent_id, await intents.check(plane, caller, intent_id))
        except Refused as exc:  # audited by intents.check
            answers[intent_id] = Answer(intent_id, refused=exc)
    return [answers[i] for i in intent_ids]


async def _check_one(
    plane: Plane, caller: Caller, intent_id: str, revision: int, n: int, current: Intent | None = None
) -> Intent:
    """One intent's check inside the batch's transaction: the intent as checked, or ``Refused``
    (``stopped``: cancelled here; ``LimitReached`` for the caller to check it alone).
    ``current``: the intent as this transaction last wrote it, under its lock."""
    store = plane.open.intents
    try:
        # Read once (``store.check`` takes it as read), unless this transaction holds it already.
        intent = current if current is not None else await store.get_locked(intent_id)
        if intent is None:
            raise intents.unknown(intent_id)
        stopped = intents.cancelled_before_check(intent, caller)
        if stopped is not None:
            raise stopped
        if intent.checked_revision is None:
            hit = intents.stop_on(plane, intent)
            if hit is not None:
                cancelled = await store.cancel_claimed(intent_id, caller.name, hit.stop.stop_id, time.time())
                await audit_cancelled(plane, caller, hit.scope, hit.stop.stop_id, [cancelled])
                refusal = stopped_by(hit)
                refusal.extra["intent"] = asdict(cancelled)
                raise refusal
            limit = plane.config.intent_limit(intent.tool)
        else:
            revision, limit = intent.checked_revision, None  # a repeated check answers the first
        checked = await store.check(intent_id, caller.name, revision, time.time(), limit, current=intent)
    except UnknownIntent:
        raise intents.unknown(intent_id) from None
    except IntentStateError as exc:
        raise Refused(409, "invalid_transition", str(exc)) from None
    await plane.audit(
        caller, "intent.check", intent_id, "ok", f"no stop at revision {checked.checked_revision}",
        run_id=checked.run_id, revision=checked.checked_revision, batch=n,
    )  # fmt: skip
    return checked


async def settle_batch(plane: Plane, caller: Caller, outcomes: list[Outcome]) -> list[Answer]:
    """Each outcome recorded (commit with its result, fail with its error), in the order given,
    in one transaction; each audited as its one-at-a-time route audits it."""
    store = plane.open.intents
    answers: list[Answer] = []
    n = len(outcomes)
    async with plane.transaction():
        # Every intent named, read and locked in one statement; each is taken as read once (an
        # intent named twice is read again for its second outcome, as the route would read it).
        read = await store.get_locked_many([o.intent_id for o in outcomes])
        for o in outcomes:
            action = "intent.commit" if o.error is None else "intent.fail"
            now = time.time()
            current = read.pop(o.intent_id, None)
            try:
                if o.error is None:
                    committed = await store.commit(o.intent_id, caller.name, o.result, now, current)
                    intent, reason = committed, "committed"
                else:
                    intent, reason = await store.fail(o.intent_id, caller.name, o.error, now, current), o.error
            except UnknownIntent:
                refused = await plane.refuse(caller, action, o.intent_id, intents.unknown(o.intent_id))
                answers.append(Answer(o.intent_id, refused=refused))
                continue
            except IntentStateError as exc:
                invalid_move = Refused(409, "invalid_transition", str(exc))
                answers.append(
                    Answer(o.intent_id, refused=await plane.refuse(caller, action, o.intent_id, invalid_move))
                )
                continue
            await plane.audit(
                caller, action, o.intent_id, "ok", reason, state=intent.state, run_id=intent.run_id, batch=n
            )
            answers.append(Answer(o.intent_id, intent))
    return answers
