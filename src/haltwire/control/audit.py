"""Verifying the audit log, and the registry's rows against it; the head a verifier holds.

``verify`` reads the log from seq 1 in pages (bounded memory however long the log) and checks,
in this order, stopping at the first problem, all in one read snapshot (``Db.snapshot``: a stop
committed meanwhile, with its record, is in both or neither):

1. the chain (``store.audit.Chain``): every record keyed with the control plane's audit key,
   each naming the hash of the one before, seq without gaps; a malformed record is tampered;
2. the registry: every record of a stop or clear names its registry change (revision and
   digest); the changes, read in revision order, must be exactly those, unchanged: one edited,
   removed or written around the control plane is found at its revision. Changes written before
   the log was keyed (a sealed prefix) and never named by a record are not covered;
3. ``expect``: a head held from earlier (``haltwire audit head``) must still be in the log with
   its hash, so removing the newest records, or all of them, is found too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from haltwire.control.plane import Plane
from haltwire.store.audit import AuditRecord, Chain, Head, VerifyResult
from haltwire.store.registry import Registry

#: Records (and registry changes) read at a time.
PAGE: Final = 1000


class _Changes:
    """The registry's changes, walked in revision order beside the log."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.page: list[tuple[int, str]] = []
        self.seen = 0  # the last revision matched (or skipped, before the first record naming one)
        self.started = False

    async def _next(self) -> tuple[int, str] | None:
        if not self.page:
            self.page = list(reversed(await self.registry.digests(self.seen, PAGE)))
        return self.page[-1] if self.page else None

    async def named(self, ref: Mapping[str, Any], seq: int, strict: bool) -> str | None:
        """Match the change record ``seq`` names; the problem, or None. Before the first record
        that names a change, older changes are skipped unless ``strict`` (a log keyed from its
        first record names every change)."""
        revision, digest = ref.get("revision"), ref.get("sha256")
        if not isinstance(revision, int):
            return f"record {seq} names no revision"
        if not self.started and not strict:
            self.seen, self.page = revision - 1, []
        self.started = True
        found = await self._next()
        if found is not None and found[0] < revision:
            return f"registry change {found[0]} has no audit record: it was written around the control plane"
        if found is None or found[0] != revision:
            return f"registry change {revision}, recorded by audit record {seq}, is gone from the registry"
        if found[1] != digest:
            return f"registry change {revision} differs from what audit record {seq} recorded: it was edited"
        self.page.pop()
        self.seen = revision
        return None

    async def rest(self, strict: bool) -> str | None:
        """The problem with changes no record named, after the last one that was."""
        if not self.started and not strict:
            return None
        found = await self._next()
        if found is None:
            return None
        return f"registry change {found[0]} has no audit record: it was written around the control plane"


async def verify(plane: Plane, expect: Head | None = None) -> VerifyResult:
    """The audit log and the registry checked (the module's docstring)."""
    async with plane.open.db.snapshot():
        return await _verify(plane, expect)


async def _verify(plane: Plane, expect: Head | None) -> VerifyResult:
    stores = plane.open
    changes = _Changes(stores.registry)
    chain = Chain(stores.audit.key)
    since = 0
    while True:
        page = await stores.audit.records(since_seq=since, limit=PAGE)
        for record in page:
            if chain.add(record) is not None:
                return chain.result()
            problem = await _named(changes, record, strict=chain.sealed == 0 and chain.unkeyed == 0)
            if problem is not None:
                return _failed(chain, record.seq, problem)
        if len(page) < PAGE:
            break
        since = page[-1].seq
    result = chain.result()
    if not result.ok:
        return result
    problem = await changes.rest(strict=chain.sealed == 0)
    if problem is not None:
        return _failed(chain, None, problem)
    if expect is None:
        return result
    return chain.expect(expect, await stores.audit.at_seq(expect.seq))


async def _named(changes: _Changes, record: AuditRecord, strict: bool) -> str | None:
    ref = record.detail.get("change")
    if ref is None:
        return None
    if not isinstance(ref, dict):
        return f"record {record.seq} names its change in no known form"
    return await changes.named(ref, record.seq, strict)


def _failed(chain: Chain, seq: int | None, problem: str) -> VerifyResult:
    result = chain.result()
    return VerifyResult(False, result.checked, seq, problem, result.head_seq, result.head_hash, result.sealed)


async def head(plane: Plane) -> Head:
    """The newest record's seq and hash, read now."""
    return await plane.open.audit.head()
