"""The audit log over either SQL backend: table ``audit``, beside the registry's.

Each append is one write transaction under the audit log's lock (in PostgreSQL, an advisory
lock for this schema; in SQLite, the file's write lock) that reads the latest record and
inserts the next, so seq and prev_hash are assigned from the committed tip even with other
processes appending.
"""

from __future__ import annotations

from haltwire.store.audit import (
    DDL,
    GENESIS,
    QUERIES,
    AuditLog,
    AuditRecord,
    Fields,
    Head,
    as_row,
    from_row,
    new_record,
    records_query,
)
from haltwire.store.sql import Db, Store, Tables


class SqlAuditLog(Store, AuditLog):
    TABLES = Tables("audit", "audit log", ("audit",), DDL)

    def __init__(self, db: Db, key: bytes | None = None) -> None:
        super().__init__(db)
        self.key = key

    async def _append(self, fields: Fields, now: float) -> AuditRecord:
        # Inside a caller's transaction (a stop and its record), the lock is held until it
        # commits: the next append waits, so seq order is commit order.
        async with self._db.write("audit") as tx:
            record = new_record(await tx.one(QUERIES["last"]), fields, now, self.key)
            await tx.execute(QUERIES["insert"], as_row(record))
        return record

    async def head(self) -> Head:
        row = await self._db.one(QUERIES["last"])
        return Head(0, GENESIS) if row is None else Head(int(row[0]), str(row[1]))

    async def at_seq(self, seq: int) -> AuditRecord | None:
        """The record with this seq, if there is one."""
        row = await self._db.one(QUERIES["at_seq"], (seq,))
        return None if row is None else from_row(row)

    async def records(
        self, *, since_seq: int = 0, target: str | None = None, limit: int | None = None
    ) -> list[AuditRecord]:
        text, params = records_query(since_seq, target, limit)
        return [from_row(row) for row in await self._db.all(text, params)]
