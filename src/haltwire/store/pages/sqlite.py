"""The page outbox in the registry's SQLite file (table ``pages``)."""

from __future__ import annotations

from haltwire.store.pages.tables import SqlPageStore
from haltwire.store.sqlite import SqliteStore


class SqlitePageStore(SqlPageStore, SqliteStore):
    """Open with ``await SqlitePageStore.open(path)``; the table is created if missing."""
