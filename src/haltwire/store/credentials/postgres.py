"""The credential map in the registry's PostgreSQL schema (table ``credentials``), shared by replicas."""

from __future__ import annotations

from psycopg import sql

from haltwire.store.credentials import DDL, QUERIES, CredentialRecord, as_row, from_row
from haltwire.store.sql import PostgresConnection

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
_LOCK = "SELECT pg_advisory_xact_lock(hashtext({name}))"


def _bind(text: str, schema: str) -> sql.Composed:
    return sql.SQL(text.replace("?", "%s")).format(credentials=sql.Identifier(schema, "credentials"))


class PostgresCredentialStore:
    """Open with ``await PostgresCredentialStore.open(url, schema=...)``; the table is created if missing."""

    def __init__(self, db: PostgresConnection, queries: dict[str, sql.Composed]) -> None:
        self._db = db
        self._q = queries

    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str = "haltwire-credentials",
    ) -> PostgresCredentialStore:
        queries = {name: _bind(text, schema) for name, text in QUERIES.items()}
        # The DDL runs under a lock: replicas starting together must not race CREATE INDEX.
        lock = sql.SQL(_LOCK).format(name=sql.Literal(f"haltwire.credentials:{schema}"))
        db = await PostgresConnection.open(
            url,
            schema,
            connect_timeout,
            application_name,
            lock_key=lock,
            ddl=[_bind(statement, schema) for statement in DDL],
            what="credential map",
            store="credentials",
        )
        return cls(db, queries)

    async def record(self, credential: CredentialRecord) -> None:
        async with self._db.connection() as conn:
            await conn.execute(self._q["record"], as_row(credential))

    async def for_run(self, run_id: str) -> list[CredentialRecord]:
        return [from_row(row) for row in await self._db.fetchall(self._q["for_run"], (run_id,))]

    async def aclose(self) -> None:
        await self._db.aclose()
