"""The newest audit records, and among them the refusals and the tripwire firings: what the
operators' dashboard shows as it happens.

Read from the audit log's head backwards, one page of ``SCAN`` records: the log is never
pruned, so nothing here reads all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from haltwire.control.access import authorize
from haltwire.control.config import Caller
from haltwire.control.plane import Plane
from haltwire.store.audit import AuditRecord

#: The newest records read per look.
SCAN: Final = 500


@dataclass(frozen=True, slots=True)
class Recent:
    #: Newest first, each list at most the ``limit`` asked for.
    records: list[AuditRecord]
    #: Writes refused by the control plane (stops, leases, intents, ...): outcome ``refused``.
    refusals: list[AuditRecord]
    #: Tripwires' stops (role ``tripwire``) and shadow firings (``stop.shadow``).
    firings: list[AuditRecord]


def is_firing(record: AuditRecord) -> bool:
    if record.action == "stop.shadow":
        return True
    return record.action == "stop.issue" and record.role == "tripwire" and record.outcome == "ok"


async def recent(plane: Plane, caller: Caller, limit: int = 50) -> Recent:
    """The newest records the caller may read (role ``audit.read``)."""
    await authorize(plane, caller, "audit.read")
    audit = plane.open.audit
    head = await audit.head()
    page = await audit.records(since_seq=max(0, head.seq - SCAN), limit=SCAN)
    newest = page[::-1]
    return Recent(
        records=newest[:limit],
        refusals=[r for r in newest if r.outcome == "refused"][:limit],
        firings=[r for r in newest if is_firing(r)][:limit],
    )
