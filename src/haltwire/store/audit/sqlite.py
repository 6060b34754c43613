"""The audit log in one SQLite file: table ``audit``, next to the registry's if the path is shared."""

from __future__ import annotations

from haltwire.store.audit.tables import SqlAuditLog
from haltwire.store.sqlite import SqliteStore


class SqliteAuditLog(SqlAuditLog, SqliteStore):
    """Open with ``await SqliteAuditLog.open(path)``; the table is created if missing."""
