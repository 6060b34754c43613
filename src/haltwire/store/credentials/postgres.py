"""The credential map in the registry's PostgreSQL schema (table ``credentials``), shared by replicas."""

from __future__ import annotations

from haltwire.store.credentials.tables import SqlCredentialStore
from haltwire.store.postgres import PostgresStore


class PostgresCredentialStore(SqlCredentialStore, PostgresStore):
    """Open with ``await PostgresCredentialStore.open(url, schema=...)``; the table is created if missing."""
