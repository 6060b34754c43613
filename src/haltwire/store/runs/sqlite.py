"""Runs and checkpoints in the registry's SQLite file (tables ``runs`` and ``checkpoints``)."""

from __future__ import annotations

from haltwire.store.runs.tables import SqlRunStore
from haltwire.store.sql import Params
from haltwire.store.sqlite import SqliteStore


class SqliteRunStore(SqlRunStore, SqliteStore):
    """Open with ``await SqliteRunStore.open(path)``; the tables are created if missing."""

    def _any_of(self, run_ids: list[str]) -> tuple[str, Params]:
        return f"({', '.join('?' for _ in run_ids)})", run_ids
