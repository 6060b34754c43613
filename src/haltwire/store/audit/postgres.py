"""The audit log in PostgreSQL: table ``audit`` in the given schema (the registry's, if shared)."""

from __future__ import annotations

from haltwire.store.audit.tables import SqlAuditLog
from haltwire.store.postgres import PostgresStore


class PostgresAuditLog(SqlAuditLog, PostgresStore):
    """Open with ``await PostgresAuditLog.open(url, schema=...)``; the table is created if missing."""
