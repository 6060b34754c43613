"""The running control plane's state: its config, its stores, its view of the stops, its watchers.

One ``Plane`` per control-plane process, held on the app (``app.state.plane``). The rules
(``access``, ``stops``, ``runs``, ``credentials``, ``intents``, ``reports``) take it as their
first argument; nothing here knows of HTTP.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio

from haltwire.control.broker import Broker
from haltwire.control.config import Caller, ControlConfig
from haltwire.control.drills import DrillData
from haltwire.control.errors import Refused
from haltwire.control.leases import LeaseDesk
from haltwire.control.mirror import StopMirror
from haltwire.control.stores import Stores
from haltwire.stops import StopRecord
from haltwire.store.audit import Head, Outcome
from haltwire.store.registry import RegistryUnavailable

#: Runs whose agent and tenant are cached (a run never changes hands); cleared when full.
_RUN_OWNERS_MAX: Final = 100_000
#: How many watches read a page of the registry's history at the same time.
REPLAY_READS: Final = 4
#: The longest text an audit record keeps whole, and how much of a longer one it keeps.
MAX_AUDIT_TEXT: Final = 1024
EXCERPT: Final = 256


def excerpt(text: str) -> str:
    """``text``, or past ``MAX_AUDIT_TEXT`` characters its start, its length and its SHA-256."""
    if len(text) <= MAX_AUDIT_TEXT:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:EXCERPT]}... ({len(text)} characters, sha256 {digest})"


class Plane:
    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        #: Token SHA-256 to caller.
        self.callers = config.callers()
        self.heartbeat_s = config.control.heartbeat_s
        self.stores: Stores | None = None
        self._changed = anyio.Event()
        #: Called after each change this process writes: wake-ups for the control plane's other
        #: processes where the store cannot send them (``haltwire.control_processes``).
        self.peers: list[Callable[[], None]] = []
        self._run_owners: dict[str, tuple[str, str]] = {}
        #: Grants leases to runs; None without [leases] (the run endpoints answer 501).
        self.leases = LeaseDesk.from_config(config)
        #: The stops the plane's own decisions check (leases, credentials, intents): the lease
        #: desk's mirror, or one of its own without [leases].
        self.mirror = self.leases.mirror if self.leases else StopMirror()
        #: Issues run credentials; None without [broker] (the credential endpoints answer 501).
        self.broker = Broker.from_config(config, self.mirror)
        #: One [[intent_limits]] stop at a time, so checks past a run's limit together write one.
        self.limit_stops = anyio.Lock()
        #: Watches reading the registry at once (each a page; see ``stops.changes_after``).
        self.replay_reads = anyio.Semaphore(REPLAY_READS)
        #: The audit log's head as last read (``follow_audit_head``): the watch publishes it.
        self.audit_head: Head | None = None
        #: The drill identities and tenants, whose data is marked (``haltwire.control.drills``).
        self.drills = DrillData.from_config(config)

    @property
    def open(self) -> Stores:
        if self.stores is None:
            raise RegistryUnavailable("the control plane's stores are not open")
        return self.stores

    def notify(self) -> None:
        """Wake every watcher: this process wrote a registry change. The control plane's other
        processes on the same SQLite file are told too (``peers``)."""
        self.wake()
        for tell in self.peers:
            tell()

    def wake(self) -> None:
        """Wake this process's watchers: the registry has a new change."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Every store write and audit record inside commits together when the block ends, or
        none does: ``RegistryUnavailable`` (its ``written`` says which), or what the block
        raised. Refusals are audited after it, in a transaction of their own (``refuse``).
        Reads inside see the block's own writes: never catch the mirror up inside one that
        writes a stop (it would hold a stop that may yet roll back)."""
        async with self.open.db.write():
            yield

    async def follow_audit_head(self) -> None:
        """Keep ``audit_head`` current: read after every registry change and once a heartbeat
        period (other writes, other replicas' too). Runs until cancelled by its owner."""
        while True:
            changed = self.changed
            # On failure the head stays as last read; the watch reports the store's failure itself.
            with contextlib.suppress(RegistryUnavailable):
                self.audit_head = await self.open.audit.head()
            with anyio.move_on_after(self.heartbeat_s):
                await changed.wait()

    @property
    def changed(self) -> anyio.Event:
        """Set at the next change; take it before reading, so a write after the read wakes you."""
        return self._changed

    async def catch_up(self) -> StopMirror:
        """The mirror, current with the registry (one ``MAX(revision)`` query when it is)."""
        await self.mirror.catch_up(self.open.registry)
        return self.mirror

    async def run_owner(self, run_id: str) -> tuple[str, str] | None:
        """The agent and tenant a run belongs to (a run never changes hands, so it is cached)."""
        owner = self._run_owners.get(run_id)
        if owner is None:
            run = await self.open.runs.get(run_id)
            if run is None:
                return None
            if len(self._run_owners) >= _RUN_OWNERS_MAX:
                self._run_owners.clear()
            owner = self._run_owners[run_id] = (run.agent, run.tenant)
        return owner

    async def run_tenant(self, run_id: str) -> str | None:
        owner = await self.run_owner(run_id)
        return None if owner is None else owner[1]

    async def stop(self, stop_id: str) -> StopRecord | None:
        return await self.open.registry.get_stop(stop_id)

    async def audit(
        self, caller: Caller, action: str, target: str, outcome: Outcome, reason: str, **detail: Any
    ) -> None:
        """Append a record. The log is append-only and never pruned, so text a caller chose (a
        refused body's values echoed in a message, say) is kept as an excerpt and a hash. Drill
        data says so (``drill: true``; ``haltwire.control.drills``)."""
        kept = {k: excerpt(v) if isinstance(v, str) else v for k, v in detail.items()}
        if await self.drills.record(caller, target, detail, self.run_tenant, self.stop):
            kept["drill"] = True
        await self.open.audit.append(
            caller.name, caller.role, action, excerpt(target), outcome, excerpt(reason), kept, now=time.time()
        )

    async def recorded(self, action: str, target: str) -> bool:
        """Whether an ``action`` record on ``target`` is in the log: a report a gateway retried
        (its id the target) is recorded once."""
        return any(r.action == action for r in await self.open.audit.records(target=target))

    async def refuse(self, caller: Caller, action: str, target: str, exc: Refused, **detail: Any) -> Refused:
        """Audit a refused write with its code; answers ``exc`` for the caller to raise."""
        await self.audit(caller, action, target, "refused", exc.message, code=exc.code, **detail)
        return exc
