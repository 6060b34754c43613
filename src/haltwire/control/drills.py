"""Drill data: what ``haltwire drill`` writes into the control plane it drills, marked as such.

A **drill identity** says ``drill = true`` in ``[[identities]]`` (the drill's operator or
tripwire, its canary runtime). A **drill tenant** is the tenant of a drill identity of role
``agent``; the config refuses a real agent identity in it, so every run of a drill tenant is a
**drill run**. A **drill stop** was issued by a drill identity, or names a drill tenant
(``tenant:T``) or a drill run (``run:ID``).

An audit record is drill data when, in this order of checks (``DrillData.record``):

1. a drill identity wrote it;
2. its target is a drill stop's id, a drill run's id, or a scope as above;
3. its detail names a drill run (``run_id``), a drill stop (``stop_id``) or such a scope
   (``scope``: a clear's record, say).

Such records carry ``drill: true`` (``Plane.audit``); the API's stops, runs and run reports say
``drill``; the escalation rules count no trip of a drill run and no stop of a drill identity;
and a drill stop pages no one (a drill stops and clears at every rep: on-call would be paged for
each). Nothing changes for a control plane without drill identities.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from haltwire.control.config import Caller, ControlConfig
from haltwire.stops import StopRecord

#: A run's tenant (None: no such run), and a stop by id (None: no such stop).
TenantOf = Callable[[str], Awaitable[str | None]]
StopOf = Callable[[str], Awaitable[StopRecord | None]]


@dataclass(frozen=True, slots=True)
class DrillData:
    """The config's drill identities (by name) and drill tenants."""

    actors: frozenset[str] = frozenset()
    tenants: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: ControlConfig) -> DrillData:
        drills = [i for i in config.identities if i.drill]
        return cls(frozenset(i.name for i in drills), frozenset(i.tenant for i in drills if i.role == "agent"))

    def __bool__(self) -> bool:
        return bool(self.actors or self.tenants)

    def of_tenant(self, tenant: str | None) -> bool:
        return tenant is not None and tenant in self.tenants

    async def of_scope(self, scope: str, tenant_of: TenantOf) -> bool:
        """Whether ``scope`` names a drill tenant or a drill run."""
        if scope.startswith("tenant:"):
            return self.of_tenant(scope.removeprefix("tenant:"))
        if scope.startswith("run:"):
            return self.of_tenant(await tenant_of(scope.removeprefix("run:")))
        return False

    async def of_stop(self, stop: StopRecord, tenant_of: TenantOf) -> bool:
        return stop.issued_by in self.actors or await self.of_scope(stop.scope, tenant_of)

    async def _of_id(self, target: str, tenant_of: TenantOf, stop_of: StopOf) -> bool:
        """Whether ``target`` (a scope, a stop's id or a run's) is drill data."""
        if ":" in target:
            return await self.of_scope(target, tenant_of)
        if target.startswith("stp_"):
            stop = await stop_of(target)
            return stop is not None and await self.of_stop(stop, tenant_of)
        return bool(target) and self.of_tenant(await tenant_of(target))

    async def record(
        self, caller: Caller, target: str, detail: Mapping[str, Any], tenant_of: TenantOf, stop_of: StopOf
    ) -> bool:
        """Whether an audit record is drill data (the module's docstring, checks 1 to 3)."""
        if caller.drill:
            return True
        if not self:
            return False
        if await self._of_id(target, tenant_of, stop_of):
            return True
        named = [detail.get(k) for k in ("run_id", "stop_id", "scope")]
        for value in named:
            if isinstance(value, str) and value != target and await self._of_id(value, tenant_of, stop_of):
                return True
        return False
