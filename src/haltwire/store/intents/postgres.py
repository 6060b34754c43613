"""Intents in the registry's PostgreSQL schema (table ``intents``), shared by every replica."""

from __future__ import annotations

from haltwire.store.intents.tables import SqlIntentStore
from haltwire.store.postgres import PostgresStore


class PostgresIntentStore(SqlIntentStore, PostgresStore):
    """Open with ``await PostgresIntentStore.open(url, schema=...)``; the table is created if missing."""
