"""Idempotency records in memory, for a single gateway process.

They are lost when the gateway restarts: a key used before the restart is free again
after it. Several gateways, or keys that must outlive a restart, need the Redis store.
Atomic because the event loop runs one ``begin`` at a time and it never awaits.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio.abc

from haltwire.store.idempotency import CONFLICT, FRESH, IN_FLIGHT, Begun, Recorded

_SWEEP_EVERY = 4096


@dataclass(slots=True)
class _Record:
    fingerprint: str
    expires_at: float
    outcome: str | None = None


class MemoryIdempotency:
    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}
        self._begins = 0

    async def begin(self, scope_key: str, fingerprint: str, now: float, ttl_s: float) -> Begun:
        self._begins += 1
        if self._begins % _SWEEP_EVERY == 0:
            self._sweep(now)
        record = self._records.get(scope_key)
        if record is None or record.expires_at <= now:
            self._records[scope_key] = _Record(fingerprint, now + ttl_s)
            return FRESH
        if record.fingerprint != fingerprint:
            return CONFLICT
        if record.outcome is None:
            return IN_FLIGHT
        return Recorded(record.outcome)

    def _sweep(self, now: float) -> None:
        # Expired keys are dropped now and then, so memory follows the keys of the last ttl_s.
        for key in [k for k, r in self._records.items() if r.expires_at <= now]:
            del self._records[key]

    async def complete(self, scope_key: str, outcome: str) -> None:
        record = self._records.get(scope_key)
        if record is not None:
            record.outcome = outcome

    async def release(self, scope_key: str) -> None:
        record = self._records.get(scope_key)
        if record is not None and record.outcome is None:
            del self._records[scope_key]

    def __len__(self) -> int:
        return len(self._records)

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        return None  # nothing runs in the background

    async def aclose(self) -> None:
        return None
