"""The registry in one SQLite file (table ``changes``): the embedded default."""

from __future__ import annotations

from haltwire.store.registry.tables import SqlRegistry
from haltwire.store.sqlite import SqliteStore


class SqliteRegistry(SqlRegistry, SqliteStore):
    """Open with ``await SqliteRegistry.open(path)``; the table is created if missing."""
