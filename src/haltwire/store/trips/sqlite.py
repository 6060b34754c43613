"""What the whole-run rules decided, in the registry's SQLite file."""

from __future__ import annotations

from haltwire.store.sqlite import SqliteStore
from haltwire.store.trips.tables import SqlTripStore


class SqliteTripStore(SqlTripStore, SqliteStore):
    """Opened with the registry and the run store (``haltwire.control.stores``): its queries read theirs."""
