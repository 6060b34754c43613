"""The page outbox over either SQL backend (table ``pages``, beside the registry).

A claim is one conditional UPDATE (pending, and not held by another replica's claim), so two
replicas never both send one page; dropping a receiver's oldest pages takes a lock per receiver.
"""

from __future__ import annotations

from collections.abc import Sequence

from haltwire.store.pages import DDL, QUERIES, PageRecord, PageState, as_row, from_row
from haltwire.store.sql import Store, Tables


class SqlPageStore(Store):
    TABLES = Tables("pages", "page outbox", ("pages",), DDL)

    async def add(self, pages: Sequence[PageRecord]) -> None:
        if not pages:
            return
        async with self._db.write() as tx:
            for page in pages:
                await tx.execute(QUERIES["add"], as_row(page))

    async def head(self, target: str) -> PageRecord | None:
        row = await self._db.one(QUERIES["head"], (target,))
        return None if row is None else from_row(row)

    async def claim(self, page_id: str, now: float, until: float) -> bool:
        async with self._db.write() as tx:
            return await tx.one(QUERIES["claim"], (until, page_id, now)) is not None

    async def settle(self, page_id: str, state: PageState, attempts: int, next_at: float, at: float) -> None:
        async with self._db.write() as tx:
            await tx.execute(QUERIES["settle"], (state, attempts, next_at, at, page_id))

    async def pending(self, target: str) -> int:
        row = await self._db.one(QUERIES["count"], (target,))
        return 0 if row is None else int(row[0])

    async def drop_oldest(self, target: str, keep: int, at: float) -> list[str]:
        async with self._db.write() as tx:
            await tx.lock("pages", target)
            ids = [str(row[0]) for row in await tx.all(QUERIES["pending"], (target,))][keep:]
            for page_id in ids:
                await tx.execute(QUERIES["drop"], (at, page_id))
        return ids

    async def get(self, page_id: str) -> PageRecord | None:
        row = await self._db.one(QUERIES["get"], (page_id,))
        return None if row is None else from_row(row)

    async def for_subject(self, subject: str) -> list[PageRecord]:
        return [from_row(row) for row in await self._db.all(QUERIES["for_subject"], (subject,))]
