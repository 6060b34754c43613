"""Idempotency keys for ``bounded`` tools: a repeated call is answered from its first outcome.

Every call to a bounded tool carries a key: the client's, in
``_meta["io.haltwire/idempotency_key"]`` (a string of 1 to 255 characters), else one the
gateway derives from (agent, tenant, run, tool, arguments), so the same call repeated in the same
run is the same operation. Keys are scoped per agent within its tenant (``Identity.owner``: two
agents, or one agent id in two tenants, never collide; its versions share them, so a repeat
after a switch of version is still answered once), and the key used is returned in the
result's ``_meta`` and forwarded to the upstream in the call's.

- first use: the call is made; its answer (a result, an error result, or a
  ``deadline_exceeded`` refusal) is recorded and the key is held ``ttl_s``;
- the same key and the same (tool, arguments): the recorded answer, marked
  ``_meta["io.haltwire/replayed"] = true``, and the upstream is not called;
- the same key and other arguments: ``idempotency_conflict``;
- the same key while the first call has no recorded answer (in flight, or cut off by a
  crash or a disconnect): ``outcome_unknown``.

A call that provably did not happen frees its key again: ``upstream_unavailable`` (whose
refusal asks for the call again) and a JSON-RPC error from the upstream. A store that cannot
be reached refuses the call ``counters_unavailable``: no call is made without the check.

Policy only: the records live in a ``haltwire.store.idempotency`` store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from haltwire import refusal
from haltwire.identity import Identity
from haltwire.meta import KEY_META, REPLAYED_META
from haltwire.refusal import Refusal
from haltwire.store.idempotency import Conflict, IdempotencyStore, IdempotencyUnavailable, InFlight, Recorded

log = logging.getLogger("haltwire.gateway")

MAX_KEY_CHARS: Final = 255
#: How long recording an outcome may take once the call is over (shielded from cancellation).
COMPLETE_TIMEOUT_S = 2.0

Clock = Callable[[], float]
#: Makes the upstream call with the given ``_meta``: the result in wire form, or a refusal.
Forward = Callable[[dict[str, Any] | None], Awaitable[dict[str, Any] | Refusal]]


class InvalidKey(MCPError):
    def __init__(self, why: str) -> None:
        super().__init__(INVALID_PARAMS, f"Invalid {KEY_META}: {why}")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def derived_key(
    agent: str, tenant: str, run: str | None, tool: str, arguments: dict[str, Any] | None
) -> str:
    """The key of a call that brought none: the same call in the same run is the same operation.
    The tenant is in it because the upstream sees every tenant's keys through one credential."""
    return hashlib.sha256(_canonical([agent, tenant, run or "", tool, arguments or {}])).hexdigest()


def fingerprint(tool: str, arguments: dict[str, Any] | None) -> str:
    return hashlib.sha256(_canonical([tool, arguments or {}])).hexdigest()


def client_key(meta: dict[str, Any] | None) -> str | None:
    """The client's key, None when it sent none; ``InvalidKey`` (JSON-RPC -32602) when malformed."""
    if not meta or KEY_META not in meta:
        return None
    key = meta[KEY_META]
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
        raise InvalidKey(f"must be a string of 1 to {MAX_KEY_CHARS} characters")
    return key


def _with_meta(result: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    meta = result.get("_meta")
    result["_meta"] = {**meta, **extra} if isinstance(meta, dict) else extra
    return result


def _refusal_with_meta(r: Refusal, extra: dict[str, Any]) -> Refusal:
    return dataclasses.replace(r, meta=(*r.meta, *extra.items()))


def _encode(outcome: dict[str, Any] | Refusal) -> str:
    if isinstance(outcome, Refusal):
        return json.dumps({"refusal": outcome.error()}, separators=(",", ":"))
    return json.dumps({"result": outcome}, separators=(",", ":"))


def _decode(text: str) -> dict[str, Any] | Refusal:
    recorded = json.loads(text)
    if "result" in recorded:
        result: dict[str, Any] = recorded["result"]
        return result
    return Refusal.from_error(recorded["refusal"])


#: Refusals ``forward`` answers without reaching the upstream: unreachable (its refusal asks for
#: the call again), or a stop that came while the call was admitted (``inflight.InFlight.start``;
#: a bounded call already at its upstream is never cut, so these come only from that check).
_NOT_REACHED: Final = frozenset({"upstream_unavailable", "stopped", "lease_invalid"})


class Idempotency:
    def __init__(self, store: IdempotencyStore, ttl_s: float, *, clock: Clock = time.time) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock

    async def call(
        self,
        identity: Identity,
        run: str | None,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        forward: Forward,
    ) -> dict[str, Any] | Refusal:
        """The call's answer: made once through ``forward``, or from the key's record."""
        key = client_key(meta)
        if key is None:
            key = derived_key(identity.agent, identity.tenant, run, tool, arguments)
        # The digest keeps store keys short and colon-free whatever the client's key holds.
        scope_key = f"{identity.owner}:{hashlib.sha256(key.encode()).hexdigest()}"
        tag = {KEY_META: key}
        try:
            begun = await self.store.begin(scope_key, fingerprint(tool, arguments), self._clock(), self.ttl_s)
        except IdempotencyUnavailable as exc:
            log.warning("idempotency store unavailable: %s", exc)
            return _refusal_with_meta(refusal.counters_unavailable(), tag)
        if isinstance(begun, Conflict):
            return _refusal_with_meta(refusal.idempotency_conflict(key), tag)
        if isinstance(begun, InFlight):
            return _refusal_with_meta(refusal.outcome_unknown(tool, key), tag)
        if isinstance(begun, Recorded):
            replayed = {**tag, REPLAYED_META: True}
            outcome = _decode(begun.outcome)
            if isinstance(outcome, Refusal):
                return _refusal_with_meta(outcome, replayed)
            return _with_meta(outcome, replayed)
        recorded: str | None = None
        free = False
        try:
            try:
                answer = await forward({**(meta or {}), KEY_META: key})
            except MCPError:
                free = True  # the upstream answered a JSON-RPC error: nothing was done
                raise
            if isinstance(answer, Refusal):
                if answer.code in _NOT_REACHED:
                    free = True  # the upstream was not reached: nothing to record
                    return _refusal_with_meta(answer, tag)
                recorded = _encode(answer)
                return _refusal_with_meta(answer, tag)
            recorded = _encode(answer)
            return _with_meta(answer, tag)
        finally:
            # Shielded, like the slot release: an answer the upstream gave is recorded even if
            # the client has gone. Nothing recorded (cancelled mid-call): the key stays in
            # flight, and a repeat is refused outcome_unknown.
            if recorded is not None or free:
                with anyio.move_on_after(COMPLETE_TIMEOUT_S, shield=True):
                    try:
                        if recorded is not None:
                            await self.store.complete(scope_key, recorded)
                        else:
                            await self.store.release(scope_key)
                    except IdempotencyUnavailable as exc:
                        log.warning("could not record the outcome of key %s of %s (%s)", key, identity.owner, exc)
