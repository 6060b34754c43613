"""The audit log over either SQL backend: table ``audit``, beside the registry's.

Each append is one write transaction under the audit log's lock (in PostgreSQL, an advisory
lock for this schema; in SQLite, the file's write lock) that reads the latest record and
inserts the next, so seq and prev_hash are assigned from the committed tip even with other
processes appending. The index by subject (``index``) is written in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    index,
    new_record,
    records_query,
)
from haltwire.store.sql import Db, Store, Tables

#: Where a transaction keeps the newest record it appended (``Tx.memo``).
TIP = "audit.tip"
#: Names bound in one ``about`` query (each twice): far below SQLite's limit on parameters.
ABOUT_CHUNK = 400


class SqlAuditLog(Store, AuditLog):
    TABLES = Tables("audit", "audit log", ("audit", "audit_subjects", "audit_indexed"), (*DDL, *index.DDL))

    def __init__(self, db: Db, key: bytes | None = None) -> None:
        super().__init__(db)
        self.key = key

    async def _append(self, fields: Fields, now: float) -> AuditRecord:
        # Inside a caller's transaction (a stop and its record), the lock is held until it
        # commits: the next append waits, so seq order is commit order.
        async with self._db.write() as tx:
            # The transaction's own last append, if any: it holds the lock, so nothing came after.
            last = tx.memo.get(TIP)
            if last is None:
                await tx.lock("audit")
                last = await tx.one(QUERIES["last"])
            record = new_record(last, fields, now, self.key)
            await tx.execute(QUERIES["insert"], as_row(record, fields[-1]))
            for row in index.rows(record.seq, record.target, record.detail):
                await tx.execute(index.QUERIES["insert"], row)
            tx.memo[TIP] = (record.seq, record.hash)
        return record

    async def about(self, names: Iterable[str]) -> list[AuditRecord]:
        """The records whose target, or a run, intent or stop their detail names, is one of
        ``names``, in seq order: a superset of what a report keeps, never the whole log (but
        the records of a database made before the index, until ``backfill`` has run)."""
        wanted = sorted(set(names))
        found: dict[int, AuditRecord] = {}
        for start in range(0, len(wanted), ABOUT_CHUNK):
            chunk = wanted[start : start + ABOUT_CHUNK]
            for row in await self._db.all(index.about_query(len(chunk)), (*chunk, *chunk)):
                record = from_row(row)
                found[record.seq] = record
        for record in await self._unindexed(await self._legacy()):
            found.setdefault(record.seq, record)
        return [found[seq] for seq in sorted(found)]

    async def _legacy(self) -> int:
        row = await self._db.one(index.QUERIES["legacy"])
        return 0 if row is None else int(row[0])

    async def _unindexed(self, legacy: int) -> list[AuditRecord]:
        if not legacy:
            return []
        return [from_row(row) for row in await self._db.all(index.QUERIES["legacy_records"], (legacy,))]

    async def backfill(self) -> int:
        """Index the records written before the index existed, once; answers how many."""
        if not await self._legacy():
            return 0
        async with self._db.write("audit") as tx:
            legacy = await self._legacy()  # another process may have done it meanwhile
            records = await self._unindexed(legacy)
            for record in records:
                for row in index.rows(record.seq, record.target, record.detail):
                    await tx.execute(index.QUERIES["insert"], row)
            await tx.execute(index.QUERIES["indexed"])
        return len(records)

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
