"""What the whole-run rules decided, in the registry's PostgreSQL schema, shared by every replica."""

from __future__ import annotations

from haltwire.store.postgres import PostgresStore
from haltwire.store.trips.tables import SqlTripStore


class PostgresTripStore(SqlTripStore, PostgresStore):
    """Opened with the registry and the run store (``haltwire.control.stores``): its queries read theirs."""
