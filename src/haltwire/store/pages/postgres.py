"""The page outbox in the registry's PostgreSQL schema (table ``pages``), shared by replicas."""

from __future__ import annotations

from haltwire.store.pages.tables import SqlPageStore
from haltwire.store.postgres import PostgresStore


class PostgresPageStore(SqlPageStore, PostgresStore):
    """Open with ``await PostgresPageStore.open(url, schema=...)``; the table is created if missing."""
