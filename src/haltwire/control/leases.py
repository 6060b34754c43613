"""The lease desk: whether a run may have a lease, and the signed grant when it may.

Policy only (no HTTP). The desk keeps a ``StopSet`` mirror of the stop registry and catches
it up at the start of every registration and renewal request: one ``MAX(revision)`` query,
and the new changes only when the registry has moved. So a stop written by any replica
sharing the registry is seen by the next renewal on every replica, without waiting for a
push. A grant's fencing generation is the mirror's revision at the check: every stop up to
that revision was looked at, and a stop issued after it (even one cleared since) fences
the token at the gateway.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

from haltwire.config import LeaseKeysSection
from haltwire.control.config import AgentClass, ControlConfig
from haltwire.control.errors import Refused, stopped_by
from haltwire.control.mirror import StopMirror
from haltwire.stops import Stopped, StopSet
from haltwire.store.registry import Registry
from haltwire.store.runs import RunRecord
from haltwire.tokens import Grant, LeaseClaims, LeaseKeys

#: Refusals remembered for audit-once; cleared when full (a refusal may then be audited again).
_NOTED_MAX: Final = 100_000
#: Grants held for the run store between two flushes (``take_grants``); past it, more are not
#: held (a run's lease age then shows its previous grant until its next renewal).
_GRANTS_MAX: Final = 100_000


class AuditOnce:
    """Which runs were refused for which reason already. A refused run keeps asking (renewing,
    or asking for credentials) until it notices; the audit log records each refusal once.
    Bounded: cleared when full (a refusal may then be audited again)."""

    def __init__(self) -> None:
        self._noted: set[tuple[str, str]] = set()

    def first(self, run_id: str, refusal: Refused) -> bool:
        """True the first time ``run_id`` is refused for this reason (a stop id, or the code)."""
        key = (run_id, str(refusal.extra.get("stop_id", refusal.code)))
        if key in self._noted:
            return False
        if len(self._noted) >= _NOTED_MAX:
            self._noted.clear()
        self._noted.add(key)
        return True


def ended(run: RunRecord, what: str) -> Refused:
    return Refused(409, "run_ended", f"run {run.run_id} has ended; it gets no more {what}")


class LeaseDesk:
    """Holds the signing keys, the agent classes, the stop mirror and the clock."""

    def __init__(
        self,
        keys: LeaseKeys,
        classes: Mapping[str, AgentClass],
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keys.signing is None:
            raise ValueError("the lease desk signs tokens; its keys need a signing key")
        self.keys = keys
        self.classes = dict(classes)
        self.clock = clock
        self.mirror = StopMirror()
        self._noted = AuditOnce()
        #: Run id to its latest grant's (issued_at, expires_at), since the last ``take_grants``.
        self._granted: dict[str, tuple[float, float]] = {}

    @classmethod
    def from_config(cls, config: ControlConfig) -> LeaseDesk | None:
        """The desk for ``config``; None when it has no ``[leases]`` (no leases are granted)."""
        section: LeaseKeysSection | None = config.leases
        if section is None:
            return None
        return cls(section.lease_keys(), config.agent_classes)

    def agent_class(self, name: str) -> AgentClass:
        """The run's class; a class since removed from the config falls back to ``default``."""
        return self.classes.get(name) or self.classes["default"]

    @property
    def stops(self) -> StopSet:
        return self.mirror.stops

    async def catch_up(self, registry: Registry) -> None:
        await self.mirror.catch_up(registry)

    def check(self, run: RunRecord, now: float | None = None) -> Refused | None:
        """Why ``run`` may not have a lease now, or None when it may."""
        if run.ended:
            return ended(run, "leases")
        verdict = self.stops.verdict(lambda: run.scopes, self.clock() if now is None else now)
        # A new grant has no generation to fence: only an active stop refuses it.
        return stopped_by(verdict) if isinstance(verdict, Stopped) else None

    def grant(self, run: RunRecord) -> Grant | Refused:
        """A signed lease for ``run``, or why it gets none."""
        now = self.clock()
        generation = self.stops.revision  # read before the check: the check covers it
        refusal = self.check(run, now)
        if refusal is not None:
            return refusal
        timing = self.agent_class(run.agent_class)
        claims = LeaseClaims(
            run=run.run_id,
            agent=run.agent,
            tenant=run.tenant,
            version=run.version,
            generation=generation,
            issued_at=now,
            expires_at=now + timing.ttl_s,
        )
        if len(self._granted) < _GRANTS_MAX or run.run_id in self._granted:
            self._granted[run.run_id] = (now, claims.expires_at)
        return Grant(
            run_id=run.run_id,
            token=self.keys.sign(claims),
            expires_at=claims.expires_at,
            ttl_s=timing.ttl_s,
            renew_every_s=timing.renew_every_s,
            renew_timeout_s=timing.renew_timeout_s,
            generation=generation,
        )

    def take_grants(self) -> dict[str, tuple[float, float]]:
        """The grants made since the last call (run id to its latest ``(issued_at, expires_at)``)."""
        taken, self._granted = self._granted, {}
        return taken

    def first_refusal(self, run_id: str, refusal: Refused) -> bool:
        return self._noted.first(run_id, refusal)
