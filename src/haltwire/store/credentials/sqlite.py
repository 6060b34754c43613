"""The credential map in the registry's SQLite file (table ``credentials``)."""

from __future__ import annotations

from pathlib import Path

from haltwire.store.credentials import DDL, QUERIES, CredentialRecord, as_row, from_row
from haltwire.store.sql import SqliteConnection

_TABLES = {"credentials": "credentials"}
_SCHEMA = ";\n".join(statement.format(**_TABLES) for statement in DDL) + ";"
_Q = {name: text.format(**_TABLES) for name, text in QUERIES.items()}


class SqliteCredentialStore:
    def __init__(self, db: SqliteConnection) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteCredentialStore:
        return cls(await SqliteConnection.open(path, _SCHEMA, what="credential map", store="credentials"))

    async def record(self, credential: CredentialRecord) -> None:
        await self._db.run(lambda conn: conn.execute(_Q["record"], as_row(credential)))

    async def for_run(self, run_id: str) -> list[CredentialRecord]:
        rows = await self._db.run(lambda conn: conn.execute(_Q["for_run"], (run_id,)).fetchall())
        return [from_row(row) for row in rows]

    async def aclose(self) -> None:
        await self._db.aclose()
