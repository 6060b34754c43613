"""The credential map: every credential the broker issued, by run (table ``credentials``).

A row is what an operator needs to know what a run was handed (never the token itself):
its id (``jti``), run, audience, signing key and lifetime. The table lives in the
registry's database, beside ``runs``; the DDL and queries are written once here with ``?``
placeholders and ``{credentials}`` for the table name; ``tables.SqlCredentialStore`` runs them
on either backend.
Failures raise ``RegistryUnavailable``, like the other stores'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import row_of

COLUMNS: Final = ("jti", "run_id", "audience", "kid", "issued_at", "expires_at")


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    jti: str
    run_id: str
    audience: str
    kid: str
    issued_at: float
    expires_at: float


class CredentialStore(Protocol):
    async def record(self, credential: CredentialRecord) -> None:
        """Add one issued credential to the map."""
        ...

    async def for_run(self, run_id: str) -> list[CredentialRecord]:
        """Every credential issued to ``run_id``, oldest first."""
        ...

    async def aclose(self) -> None: ...


_COLS = ", ".join(COLUMNS)

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {credentials} (
    jti        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    audience   TEXT NOT NULL,
    kid        TEXT NOT NULL,
    issued_at  DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS credentials_by_run ON {credentials} (run_id, issued_at)",
)

QUERIES: Final = {
    "record": f"INSERT INTO {{credentials}} ({_COLS}) VALUES ({', '.join('?' for _ in COLUMNS)})",
    "for_run": f"SELECT {_COLS} FROM {{credentials}} WHERE run_id = ? ORDER BY issued_at, jti",
}


def as_row(c: CredentialRecord) -> tuple[object, ...]:
    return row_of(c, COLUMNS)


def from_row(row: Sequence[Any]) -> CredentialRecord:
    jti, run_id, audience, kid, issued_at, expires_at = row
    return CredentialRecord(
        str(jti), str(run_id), str(audience), str(kid), float(issued_at), float(expires_at)
    )


__all__ = ["CredentialRecord", "CredentialStore", "RegistryUnavailable"]
