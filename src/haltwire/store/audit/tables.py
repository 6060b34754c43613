"""The audit log over either SQL backend: table ``audit``, beside the registry's.

Each append is one write transaction under the audit log's lock (in PostgreSQL, an advisory
lock for this schema; in SQLite, the file's write lock) that reads the latest record and
inserts the next, so seq and prev_hash are assigned from the committed tip even with other
processes appending.
"""

from __future__ import annotations

from haltwire.store.audit import (
    DDL,
    QUERIES,
    AuditLog,
    AuditRecord,
    Fields,
    as_row,
    from_row,
    new_record,
    records_query,
)
from haltwire.store.sql import Store, Tables


class SqlAuditLog(Store, AuditLog):
    TABLES = Tables("audit", "audit log", ("audit",), DDL)

    async def _append(self, fields: Fields, now: float) -> AuditRecord:
        async with self._db.write("audit") as tx:
            record = new_record(await tx.one(QUERIES["last"]), fields, now)
            await tx.execute(QUERIES["insert"], as_row(record))
        return record

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        text, params = records_query(since_seq, target, limit)
        return [from_row(row) for row in await self._db.all(text, params)]
