"""What every SQL store shares, so that a store's logic is written once for both backends.

A store's logic (``store/<name>/tables.py``) runs its queries on a ``Db``: ``all`` / ``one`` /
``execute`` for one statement on its own (a read), ``write()`` for a transaction. Its query
texts are written once, with ``?`` placeholders and ``{name}`` for its tables and for the
clauses whose text differs by backend (``CLAUSES``); each ``Db`` binds them its own way. A
backend module (``store/<name>/sqlite.py``, ``postgres.py``) is then one class: the logic,
opened by ``haltwire.store.sqlite.SqliteStore`` or ``haltwire.store.postgres.PostgresStore``.

Several stores may share one ``Db`` (the control plane's five do: ``Tables.union``), and then
one transaction: a ``write()`` opened while another of the same ``Db`` is open in the same task
joins it, and so does every read. So a rule writes a stop, its audit record and the intents it
cancels in one ``async with db.write():``, and they commit together or not at all.

Every driver failure raises ``RegistryUnavailable`` naming the store ("runs store failed: ...");
its ``written`` says whether a write may have been recorded all the same (a lost COMMIT).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
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

    def commit_lost(self, exc: Exception) -> RegistryUnavailable:
        return RegistryUnavailable(f"{self.store} store failed while committing: {exc}", written=None)

    @classmethod
    def union(cls, store: str, what: str, *parts: Tables) -> Tables:
        """Several stores' tables in one database, opened as one ``Db``."""
        names = tuple(name for part in parts for name in part.names)
        return cls(store, what, names, tuple(statement for part in parts for statement in part.ddl))


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

    #: A read-only snapshot (``Db.snapshot``): a ``write()`` inside it is an error.
    read_only: bool = False

    #: What a store remembers for the rest of this transaction (set anew as each begins): the
    #: audit log's newest record, once it holds the log's lock (``SqlAuditLog``).
    memo: dict[str, Any]


@dataclass(slots=True)
class RowCount:
    """The rows the reads of one block answered (``counting_rows``)."""

    rows: int = 0


_counted: ContextVar[RowCount | None] = ContextVar("haltwire_store_rows", default=None)


@contextlib.contextmanager
def counting_rows() -> Iterator[RowCount]:
    """Count the rows every read (``Db.all``, ``one``) answers in this block, in this task and
    the tasks it starts: what one request reads, for tests and benchmarks."""
    counter = RowCount()
    token = _counted.set(counter)
    try:
        yield counter
    finally:
        _counted.reset(token)


#: The write transaction open in this task, and its ``Db``: joined by its ``write()`` and reads.
_open: ContextVar[tuple[Db, Tx] | None] = ContextVar("haltwire_store_tx", default=None)


class Db(Statements):
    """A store's connections. ``all`` / ``one`` / ``execute``: one read statement, atomic on its
    own (inside a ``write()`` of this ``Db``, a statement of that transaction)."""

    @abstractmethod
    def _alone(self) -> AbstractAsyncContextManager[Statements]:
        """A connection for reading, held for one statement outside any transaction."""

    @abstractmethod
    def _begin(self) -> AbstractAsyncContextManager[Tx]:
        """A new write transaction: committed when its block ends, else rolled back."""

    @abstractmethod
    def _snapshot(self) -> AbstractAsyncContextManager[Tx]:
        """A read-only transaction on a connection of its own, seeing one committed state."""

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[None]:
        """Every read of this ``Db`` in the block, by any store on it, sees the same committed
        state, on a connection of its own (a long read holds up no other reader or writer)."""
        async with self._snapshot() as tx:
            tx.memo = {}
            token = _open.set((self, tx))
            try:
                yield
            finally:
                _open.reset(token)

    def _joined(self) -> Tx | None:
        current = _open.get()
        return current[1] if current is not None and current[0] is self else None

    @contextlib.asynccontextmanager
    async def write(self, lock: str | None = None) -> AsyncIterator[Tx]:
        """A write transaction that first takes ``lock`` (``Tx.lock``), if given; inside another
        of this ``Db`` in the same task, that one (it commits when the outermost block ends)."""
        joined = self._joined()
        if joined is not None:
            if joined.read_only:
                raise RuntimeError("a write inside a read-only snapshot")
            if lock is not None:
                await joined.lock(lock)
            yield joined
            return
        async with self._begin() as tx:
            tx.memo = {}
            token = _open.set((self, tx))
            try:
                if lock is not None:
                    await tx.lock(lock)
                yield tx
            finally:
                _open.reset(token)

    @abstractmethod
    async def follow(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` whenever another process may have written; runs until cancelled."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        joined = self._joined()
        if joined is not None:
            rows = await joined.all(query, params)
        else:
            async with self._alone() as statements:
                rows = await statements.all(query, params)
        counter = _counted.get()
        if counter is not None:
            counter.rows += len(rows)
        return rows


class Store:
    """A store's logic over its ``Db``: what both backends of the store share."""

    TABLES: ClassVar[Tables]

    def __init__(self, db: Db) -> None:
        self._db = db

    @property
    def db(self) -> Db:
        """The store's database (shared with other stores when opened on one)."""
        return self._db

    async def aclose(self) -> None:
        await self._db.aclose()
