"""The SQLite backend of the SQL stores: one stdlib ``sqlite3`` connection per store.

WAL mode with ``synchronous=FULL``: a write that returned is on disk and survives the process
being killed (and the machine losing power). A statement runs in a worker thread, under one lock
per connection, so a transaction's statements are never interleaved with another's; inside a
write transaction only BEGIN and COMMIT do (``SqliteDb.write``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Self

import anyio
import anyio.to_thread

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import CLAUSES, Db, Params, Row, Store, Tables, Tx


def _names(tables: Tables) -> dict[str, str]:
    return {name: name for name in tables.names} | {name: texts[0] for name, texts in CLAUSES.items()}


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection, tables: Tables) -> None:
        self._conn = conn
        self._tables = tables
        self._names = _names(tables)

        #: Inside a write transaction: statements run on the event loop's thread (see ``write``).
        self.inline = False

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        text = query.format(**self._names)
        try:
            if self.inline:
                return self._conn.execute(text, params).fetchall()
            return await anyio.to_thread.run_sync(lambda: self._conn.execute(text, params).fetchall())
        except sqlite3.Error as exc:
            raise self._tables.failed(exc) from exc

    async def lock(self, name: str, *parts: str) -> None:
        pass  # BEGIN IMMEDIATE already excludes every other writer on the file

    async def notify(self, payload: str) -> None:
        pass  # nobody listens: see SqliteDb.follow


class SqliteDb(Db):
    """Open with ``await SqliteDb.open(path, tables)``; the tables are created if missing."""

    def __init__(self, conn: sqlite3.Connection, tables: Tables) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._tx = _SqliteTx(conn, tables)
        self._tables = tables
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, path: str | Path, tables: Tables) -> SqliteDb:
        script = "".join(f"{statement.format(**_names(tables))};\n" for statement in tables.ddl)

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(script)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            return cls(await anyio.to_thread.run_sync(connect), tables)
        except sqlite3.Error as exc:
            raise RegistryUnavailable(f"cannot open the {tables.what} at {path}: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[_SqliteTx]:
        async with self._lock:
            if self._conn is None:
                raise self._tables.closed()
            yield self._tx

    @contextlib.asynccontextmanager
    async def write(self, lock: str | None = None) -> AsyncIterator[Tx]:
        # IMMEDIATE takes the file's write lock before the first read: no writer, in any
        # process, comes between what the transaction reads and what it writes.
        # Only BEGIN (it may wait for another process's write lock) and COMMIT (it syncs the
        # file) go to a worker thread; the statements between them hold the write lock and only
        # touch the page cache, so they run inline: one thread hop per statement cost a stop
        # and its audit record 80% more time.
        async with self._alone() as tx:
            await tx.execute("BEGIN IMMEDIATE")
            try:
                tx.inline = True
                yield tx
                tx.inline = False
                await tx.execute("COMMIT")
            except BaseException:
                tx.inline = False
                with anyio.CancelScope(shield=True), contextlib.suppress(RegistryUnavailable):
                    await tx.execute("ROLLBACK")
                raise

    async def follow(self, on_change: Callable[[], None]) -> None:
        # One control plane per file: every write is its own and wakes its watchers directly.
        # Anything else writing the file is picked up by the watch's heartbeat-period re-read.
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await anyio.to_thread.run_sync(conn.close)


class SqliteStore(Store):
    @classmethod
    async def open(cls, path: str | Path) -> Self:
        """The store in the SQLite file at ``path``; its tables are created if missing."""
        return cls(await SqliteDb.open(path, cls.TABLES))
