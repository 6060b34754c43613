"""Tokens a model call used, read from the provider's answer and counted (issue 14, point 4).

Read from ``usage`` in a whole answer, or from the stream event that carries it: for chat
completions the last chunk (the provider sends it when asked with ``stream_options:
{"include_usage": true}``, which the gateway asks for when the client did not, and then keeps
that chunk from the client: ``wants_usage``); for the Responses API the final
``response.completed`` (or ``.incomplete``, ``.failed``) event's ``response.usage``.

Counted in the gateway's counter store (``Tally``, one round trip), input and output tokens
apart, and their cost when ``[[models]] prices`` names one (in millionths of its unit), under
three keys each: the run (for its whole life, as the run's step budget), the
identity and its tenant (per fixed window of ``[limits] window_s``, as the call budget). These
are what the token budgets of the tripwires will read. A run's counts also go to its report
(``haltwire.gateway.outcomes``, ``haltwire.control.usage``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from haltwire.gateway.ceilings import RUN_WINDOW_S
from haltwire.identity import Identity, tenant_counted_as
from haltwire.store.counters import CounterStore, CountersUnavailable, Tally

log = logging.getLogger("haltwire.gateway")

#: The Responses API's events that carry the final ``response`` (and its usage).
FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass(frozen=True, slots=True)
class Tokens:
    input: int
    output: int


@dataclass(frozen=True, slots=True)
class Usage:
    """Counted: input and output tokens, and their cost in millionths of the price's unit."""

    input: int
    output: int
    money_micros: int = 0


def tokens_of(usage: Any) -> Tokens | None:
    """Input and output tokens of a ``usage`` object of either API, or None if it has none."""
    if not isinstance(usage, dict):
        return None
    i = usage.get("input_tokens", usage.get("prompt_tokens"))
    o = usage.get("output_tokens", usage.get("completion_tokens"))
    if not isinstance(i, int) or not isinstance(o, int) or isinstance(i, bool) or isinstance(o, bool):
        return None
    return Tokens(max(0, i), max(0, o))


def answer_tokens(body: bytes) -> Tokens | None:
    """The usage of a whole (non-streamed) answer."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return tokens_of(data.get("usage")) if isinstance(data, dict) else None


def wants_usage(request: dict[str, Any]) -> bool:
    """Whether a streamed chat completion request asks for the usage chunk itself."""
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def event_tokens(path: str, name: str, data: str) -> tuple[Tokens | None, bool]:
    """The usage an event carries, and whether it is chat completions' usage-only last chunk."""
    if '"usage"' not in data:
        return None, False
    try:
        parsed = json.loads(data)
    except ValueError:
        return None, False
    if not isinstance(parsed, dict):
        return None, False
    if path == "/v1/responses":
        kind = parsed.get("type", name)
        response = parsed.get("response")
        if kind in FINAL_EVENTS and isinstance(response, dict):
            return tokens_of(response.get("usage")), False
        return None, False
    tokens = tokens_of(parsed.get("usage"))
    return tokens, tokens is not None and parsed.get("choices") == []


class UsageCounts:
    """Tokens counted per run, identity and tenant in the gateway's counter store."""

    def __init__(self, store: CounterStore, window_s: float, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.window_s = window_s
        self._clock = clock

    def keys(self, identity: Identity, run: str | None) -> list[str]:
        """The count keys a call of ``identity`` in ``run`` adds to (without ``:in``/``:out``)."""
        window = int(self._clock() // self.window_s)
        # Each under who it counts (on Redis Cluster, one slot each: ``store.counters.parts``).
        out = [f"{identity.counted_as}:usage:w{window}", f"{tenant_counted_as(identity.tenant)}:usage:w{window}"]
        if run is not None:
            out.append(f"{identity.counted_as}:usage:r:{run}")
        return out

    def _ops(self, identity: Identity, run: str | None, usage: Usage) -> list[Tally]:
        ops = []
        for key in self.keys(identity, run):
            ttl = RUN_WINDOW_S if ":r:" in key else self.window_s + 60
            ops += [
                Tally(f"{key}:in", usage.input, None, ttl),
                Tally(f"{key}:out", usage.output, None, ttl),
                Tally(f"{key}:money", usage.money_micros, None, ttl),
            ]
        return ops

    async def add(self, identity: Identity, run: str | None, usage: Usage) -> None:
        """Count ``usage``; a store that cannot count now is logged (the call was served already)."""
        try:
            await self.store.tally(self._ops(identity, run, usage), self._clock())
        except CountersUnavailable as exc:
            log.warning("could not count %s of %s: %s", usage, identity.agent, exc)

    async def read(self, identity: Identity, run: str | None = None) -> dict[str, Usage]:
        """The counts now: ``identity``, ``tenant`` and, with ``run``, ``run`` (for tests, reports)."""
        values = (await self.store.tally(self._ops(identity, run, Usage(0, 0)), self._clock())).values
        names = ["identity", "tenant", "run"]
        return {names[n]: Usage(*values[3 * n : 3 * n + 3]) for n in range(len(values) // 3)}
