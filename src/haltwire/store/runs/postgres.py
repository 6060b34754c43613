"""Runs and checkpoints in the registry's PostgreSQL schema (tables ``runs`` and ``checkpoints``),
shared by every control-plane replica."""

from __future__ import annotations

from haltwire.store.postgres import PostgresStore
from haltwire.store.runs.tables import SqlRunStore
from haltwire.store.sql import Params


class PostgresRunStore(SqlRunStore, PostgresStore):
    """Open with ``await PostgresRunStore.open(url, schema=...)``; the tables are created if missing."""

    def _any_of(self, run_ids: list[str]) -> tuple[str, Params]:
        return "(SELECT unnest(?::text[]))", (run_ids,)  # one parameter, however many ids
