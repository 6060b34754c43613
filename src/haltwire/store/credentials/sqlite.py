"""The credential map in the registry's SQLite file (table ``credentials``)."""

from __future__ import annotations

from haltwire.store.credentials.tables import SqlCredentialStore
from haltwire.store.sqlite import SqliteStore


class SqliteCredentialStore(SqlCredentialStore, SqliteStore):
    """Open with ``await SqliteCredentialStore.open(path)``; the table is created if missing."""
