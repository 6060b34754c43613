"""The credential map over either SQL backend (table ``credentials``, beside ``runs``)."""

from __future__ import annotations

from haltwire.store.credentials import DDL, QUERIES, CredentialRecord, as_row, from_row
from haltwire.store.sql import Store, Tables


class SqlCredentialStore(Store):
    TABLES = Tables("credentials", "credential map", ("credentials",), DDL)

    async def record(self, credential: CredentialRecord) -> None:
        async with self._db.write() as tx:
            await tx.execute(QUERIES["record"], as_row(credential))

    async def for_run(self, run_id: str) -> list[CredentialRecord]:
        return [from_row(row) for row in await self._db.all(QUERIES["for_run"], (run_id,))]
