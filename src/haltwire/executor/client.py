"""The control plane's intent endpoints as the executor uses them.

``IntentClient`` is the runtime's ``ControlClient`` (runs, leases, the watch: the executor holds
a lease of its own) plus who its token is, claim, check, commit, fail and the restart's
``unknown``, one intent at a time or many in one request (``claim_many``, ``check_many``,
``settle_many``; a batch of one takes the one-at-a-time route), or the three in one ``turn``. Refusals raise ``ControlRefused``, anything else ``ControlUnreachable``, as
for every control client; in a batch, one intent's refusal is its own entry of the answer.

What it records must fit the control plane's limits (``haltwire.limits``), or the call, made,
would stay unrecorded: an error message is cut to a reason's length, and a result past the
body limit is recorded as its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Final, NamedTuple
from urllib.parse import quote

from haltwire.limits import fitted
from haltwire.runtime.client import ControlClient, ControlRefused
from haltwire.watch import WHOAMI_PATH

#: An outcome larger than this (as JSON) is recorded on its own, not in a batch.
BATCH_OUTCOME_BYTES: Final = 64 << 10
#: The most bytes of outcomes one batch carries (the control plane takes 4 MiB by default).
BATCH_BYTES: Final = 1 << 20

#: One intent's answer in a batch: the intent, or its refusal.
Answer = dict[str, Any] | ControlRefused


class Settlement(NamedTuple):
    """What to record of one intent: ``outcome`` (commit) or ``error`` (fail)."""

    intent_id: str
    outcome: dict[str, Any] | None
    error: str | None


#: An intent claimed in a turn: its id, and its check's answer.
Claimed = tuple[str, Answer]


def _entry(s: Settlement) -> dict[str, Any]:
    """A settlement as a batch carries it."""
    if s.outcome is None:
        return {"intent_id": s.intent_id, "error": fitted(s.error or "failed")}
    return {"intent_id": s.intent_id, "outcome": s.outcome}


def _answer(entry: dict[str, Any]) -> Answer:
    if entry.get("status") == 200:
        intent: dict[str, Any] = entry["intent"]
        return intent
    error = entry.get("error")
    return ControlRefused(int(entry.get("status", 409)), error if isinstance(error, dict) else {})


def _path(intent_id: str, action: str) -> str:
    return f"/v1/intents/{quote(intent_id, safe='')}/{action}"


def _not_kept(outcome: dict[str, Any]) -> dict[str, Any]:
    """A tool result in place of one too large to record: its size and hash, as a tool result."""
    data = json.dumps(outcome, separators=(",", ":")).encode()
    said = (
        f"The tool's result ({len(data)} bytes of JSON, sha256 {hashlib.sha256(data).hexdigest()}) "
        "was larger than the control plane records; it is not kept."
    )
    return {"content": [{"type": "text", "text": said}], "isError": bool(outcome.get("isError"))}


class IntentClient(ControlClient):
    """``async with IntentClient(url, executor_token) as control: ...``"""

    async def whoami(self) -> Any:
        """Who the control plane knows the token as, and whether it is sent every stop (judged by
        ``haltwire.watch.require_every_stop``, as the gateway's watch judges it)."""
        return await self._call("GET", WHOAMI_PATH)

    async def claim(self) -> dict[str, Any] | None:
        """The oldest pending intent, now claimed by this executor; None when none is pending."""
        data = await self._call("POST", "/v1/intents/claim")
        return data if isinstance(data, dict) else None

    async def check(self, intent_id: str) -> dict[str, Any]:
        """The final registry check before performing the call: the intent with its
        ``checked_revision``, or ``ControlRefused`` ``stopped`` (the intent is now cancelled)."""
        result: dict[str, Any] = await self._call("POST", _path(intent_id, "check"))
        return result

    async def claim_many(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` of the oldest pending intents, now claimed by this executor (one write)."""
        if limit == 1:  # the one-at-a-time route: a batch's body and answer cost more for one
            one = await self.claim()
            return [] if one is None else [one]
        data = await self._call("POST", "/v1/intent-batches/claim", {"limit": limit})
        return list(data["intents"])

    async def check_many(self, intent_ids: Sequence[str]) -> list[Answer]:
        """The final checks of several intents in one write, in that order: each the intent with
        its ``checked_revision``, or the ``ControlRefused`` its own check would have raised."""
        if len(intent_ids) == 1:
            try:
                return [await self.check(intent_ids[0])]
            except ControlRefused as exc:
                return [exc]
        data = await self._call("POST", "/v1/intent-batches/check", {"intent_ids": list(intent_ids)})
        return [_answer(entry) for entry in data["results"]]

    async def settle_many(self, settlements: Sequence[Settlement]) -> list[Answer]:
        """Record several outcomes, in that order: small ones together (a write per
        ``BATCH_BYTES``), a large result alone (``commit``, which keeps its hash if too large)."""
        if len(settlements) == 1:
            one = settlements[0]
            try:
                if one.outcome is None:
                    return [await self.fail(one.intent_id, one.error or "failed")]
                return [await self.commit(one.intent_id, one.outcome)]
            except ControlRefused as exc:
                return [exc]
        answers: dict[int, Answer] = {}
        chunk: list[tuple[int, dict[str, Any]]] = []
        size = 0

        async def flush() -> None:
            nonlocal chunk, size
            if chunk:
                data = await self._call(
                    "POST", "/v1/intent-batches/settle", {"outcomes": [e for _, e in chunk]}
                )
                answers.update(
                    (i, _answer(entry)) for (i, _), entry in zip(chunk, data["results"], strict=True)
                )
            chunk, size = [], 0

        for i, s in enumerate(settlements):
            entry = _entry(s)
            n = len(json.dumps(entry, separators=(",", ":")))
            if n > BATCH_OUTCOME_BYTES:
                try:
                    answers[i] = await self.commit(s.intent_id, s.outcome or {})
                except ControlRefused as exc:
                    answers[i] = exc
                continue
            if size + n > BATCH_BYTES:
                await flush()
            chunk.append((i, entry))
            size += n
        await flush()
        return [answers[i] for i in range(len(settlements))]

    async def turn(self, settlements: Sequence[Settlement], limit: int) -> tuple[list[Answer], list[Claimed]]:
        """Record ``settlements``, then claim and check up to ``limit`` intents, in one request
        and one write (``POST /v1/intent-turns``): the outcomes' answers, then each intent
        claimed with its check's answer (the intent checked, or the ``ControlRefused`` its
        check raised). Outcomes too large to go together are recorded first (``settle_many``)."""
        entries = [_entry(s) for s in settlements]
        settled: list[Answer] = []
        if sum(len(json.dumps(e, separators=(",", ":"))) for e in entries) > BATCH_OUTCOME_BYTES:
            settled, entries = await self.settle_many(settlements), []  # a large result among them
        data = await self._call("POST", "/v1/intent-turns", {"outcomes": entries, "claim": limit})
        if entries:
            settled = [_answer(entry) for entry in data["results"]]
        return settled, [(str(entry["intent_id"]), _answer(entry)) for entry in data["intents"]]

    async def commit(self, intent_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self._call(
                "POST", _path(intent_id, "commit"), {"outcome": outcome}
            )
        except ControlRefused as exc:
            if exc.code != "payload_too_large":
                raise
            result = await self._call("POST", _path(intent_id, "commit"), {"outcome": _not_kept(outcome)})
        return result

    async def fail(self, intent_id: str, error: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", _path(intent_id, "fail"), {"error": fitted(error)})
        return result

    async def mark_unknown(self) -> list[dict[str, Any]]:
        """After a restart: every intent this executor had claimed and not settled, now ``unknown``
        (with those an earlier restart left unknown), oldest first."""
        data = await self._call("POST", "/v1/intents/unknown")
        return list(data["intents"])

    async def intents(
        self, *, states: str | None = None, run: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        query: dict[str, str | int] = {"limit": limit}
        if states is not None:
            query["state"] = states
        if run is not None:
            query["run"] = run
        data = await self._call("GET", "/v1/intents", params=query)
        return list(data["intents"])
