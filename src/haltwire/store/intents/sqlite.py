"""Intents in the registry's SQLite file (table ``intents``).

A transition's read and write run in ``BEGIN IMMEDIATE``; ``claim_next`` is one statement.
Either takes the file's write lock before it reads, so two executors (two connections, two
processes) never claim one intent.
"""

from __future__ import annotations

from haltwire.store.intents.tables import SqlIntentStore
from haltwire.store.sqlite import SqliteStore


class SqliteIntentStore(SqlIntentStore, SqliteStore):
    """Open with ``await SqliteIntentStore.open(path)``; the table is created if missing."""
