"""The registry in PostgreSQL (table ``changes`` in the given schema), for several control-plane
replicas sharing one history: each write NOTIFYs the others, and ``follow_writes`` LISTENs."""

from __future__ import annotations

from haltwire.store import postgres
from haltwire.store.postgres import DEFAULT_URL, PostgresStore
from haltwire.store.registry.tables import SqlRegistry

__all__ = ["DEFAULT_URL", "PostgresRegistry", "notify_channel"]


class PostgresRegistry(SqlRegistry, PostgresStore):
    """Open with ``await PostgresRegistry.open(url, schema=...)``; the schema is created if missing."""


def notify_channel(schema: str) -> str:
    """The NOTIFY channel of the registry in ``schema``."""
    return postgres.notify_channel("registry", schema)
