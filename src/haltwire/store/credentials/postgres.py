"""The credential map in the registry's PostgreSQL schema (table ``credentials``), shared by replicas."""

from __future__ import annotations

from psycopg import sql

from haltwire.store.credentials import DDL, QUERIES, CredentialRecord, as_row, from_row
from haltwire.store.sql import PostgresConnection, SharedQueries

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


class PostgresCredentialStore:
    """Open with ``await PostgresCredentialStore.open(url, schema=...)``; the table is created if missing."""

    def __init__(self, db: PostgresConnection, shared: SharedQueries) -> None:
        self._db = db
        self._q = shared.bind_all(QUERIES)

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-credentials",
    ) -> PostgresCredentialStore:
        shared = SharedQueries(schema, {"credentials": sql.Identifier(schema, "credentials")})
        db = await shared.connect(
            url, connect_timeout, application_name, ddl=DDL, what="credential map", store="credentials"
        )
        return cls(db, shared)

    async def record(self, credential: CredentialRecord) -> None:
        async with self._db.connection() as conn:
            await conn.execute(self._q["record"], as_row(credential))

    async def for_run(self, run_id: str) -> list[CredentialRecord]:
        return [from_row(row) for row in await self._db.fetchall(self._q["for_run"], (run_id,))]

    async def aclose(self) -> None:
        await self._db.aclose()
