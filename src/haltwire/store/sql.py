"""What every SQL store shares, so that a store's logic is written once for both backends.

A store's logic (``store/<name>/tables.py``) runs its queries on a ``Db``: ``all`` / ``one`` /
``execute`` for one statement on its own, ``write()`` for a transaction. Its query texts are
written once, with ``?`` placeholders and ``{name}`` for its tables and for the clauses whose
text differs by backend (``CLAUSES``); each ``Db`` binds them its own way. A backend module
(``store/<name>/sqlite.py``, ``postgres.py``) is then one class: the logic, opened by
``haltwire.store.sqlite.SqliteStore`` or ``haltwire.store.postgres.PostgresStore``.

Every driver failure raises ``RegistryUnavailable`` naming the store ("runs store failed: ...").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from haltwire.store.registry import RegistryUnavailable

Row = tuple[Any, ...]
Params = Sequence[object]

#: The clauses whose text differs by backend, SQLite's first. SQLite takes no row locks: its
#: write transaction already excludes every other writer; its INTEGER PRIMARY KEY is the
#: 64-bit rowid itself, PostgreSQL's INTEGER only 32 bits.
CLAUSES = {
    "for_update": ("", "FOR UPDATE"),
    "skip_locked": ("", "FOR UPDATE SKIP LOCKED"),
    "integer_key": ("INTEGER PRIMARY KEY", "BIGINT PRIMARY KEY"),
}


@dataclass(frozen=True, slots=True)
class Tables:
    """One store's tables: its name in failures and lock names (``store``), in messages
    (``what``: "the run store is closed"), its table names, and their DDL."""

    store: str
    what: str
    names: tuple[str, ...]
    ddl: Sequence[str]

    def failed(self, exc: Exception) -> RegistryUnavailable:
        return RegistryUnavailable(f"{self.store} store failed: {exc}")

    def closed(self) -> RegistryUnavailable:
        return RegistryUnavailable(f"the {self.what} is closed")


def row_of(record: object, columns: Sequence[str], **encode: Callable[[Any], object]) -> tuple[object, ...]:
    """``record``'s attributes named by ``columns``, in that order, each through its ``encode``."""
    return tuple(encode[c](getattr(record, c)) if c in encode else getattr(record, c) for c in columns)


class Statements(ABC):
    @abstractmethod
    async def all(self, query: str, params: Params = ()) -> list[Row]:
        """Every row the statement answers (none for a statement that answers none)."""

    async def one(self, query: str, params: Params = ()) -> Row | None:
        # Every row is read: SQLite ends a RETURNING statement only once read to the end.
        rows = await self.all(query, params)
        return rows[0] if rows else None

    async def execute(self, query: str, params: Params = ()) -> None:
        await self.all(query, params)


class Tx(Statements):
    """Statements in one write transaction: committed when its block ends, else rolled back."""

    @abstractmethod
    async def lock(self, name: str, *parts: str) -> None:
        """Until the transaction ends, exclude every other transaction taking the same lock."""

    @abstractmethod
    async def notify(self, payload: str) -> None:
        """At commit, wake every process following this store's writes (``Db.follow``)."""


class Db(Statements):
    """A store's connection. ``all`` / ``one`` / ``execute``: one statement, atomic on its own."""

    @abstractmethod
    def _alone(self) -> AbstractAsyncContextManager[Statements]:
        """The connection, held for one statement outside any transaction."""

    @abstractmethod
    def write(self, lock: str | None = None) -> AbstractAsyncContextManager[Tx]:
        """A write transaction that first takes ``lock`` (``Tx.lock``), if given."""

    @abstractmethod
    async def follow(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` whenever another process may have written; runs until cancelled."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        async with self._alone() as statements:
            return await statements.all(query, params)


class Store:
    """A store's logic over its ``Db``: what both backends of the store share."""

    TABLES: ClassVar[Tables]

    def __init__(self, db: Db) -> None:
        self._db = db

    async def aclose(self) -> None:
        await self._db.aclose()
