"""The SQLite backend of the SQL stores: one stdlib ``sqlite3`` connection per store.

WAL mode with ``synchronous=FULL``: a write that returned is on disk and survives the process
being killed (and the machine losing power). A statement runs in a worker thread, under one lock
per connection, so a transaction's statements are never interleaved with another's; inside a
write transaction only BEGIN and COMMIT do (``SqliteDb._begin``).

The file is its owner's alone (``private_file``): created 0600 whatever the umask (SQLite would
make it 0644), which its ``-wal`` and ``-shm`` files then copy; an existing one open to others
is tightened to 0600 as it is opened, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final, Self

import anyio
import anyio.to_thread

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import CLAUSES, Db, Params, Row, Store, Tables, Tx

log = logging.getLogger("haltwire.store")

#: How long a connection waits for another process's write lock before failing.
BUSY_TIMEOUT_S: Final = 10.0
#: How many query texts a connection keeps bound (``_SqliteTx.all``).
TEXTS_KEPT: Final = 512
#: The files of one database: SQLite names its sidecars after it (WAL, shared memory, rollback journal).
SIDECARS: Final = ("-wal", "-shm", "-journal")


def private_file(path: str | Path) -> None:
    """Make the SQLite database at ``path`` readable and writable by its owner only.

    A missing file is created empty (SQLite takes a zero-length file as a new database) with mode
    0600, set with ``fchmod`` so the umask has no say; SQLite gives the ``-wal``, ``-shm`` and
    ``-journal`` files it creates later the database's own mode. A database or sidecar that
    exists and is open to its group or others (an earlier version made them 0644) loses those
    bits, with a warning; one this process may not change is warned about and left as it is.
    ``:memory:`` and the empty path (a temporary database) have no file.
    """
    name = str(path)
    if name in ("", ":memory:"):
        return
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
    for file in (name, *(name + suffix for suffix in SIDECARS)):
        try:
            mode = stat.S_IMODE(os.stat(file).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            try:
                os.chmod(file, mode & 0o700)
            except OSError as exc:
                log.warning("%s is mode %04o, open to others, and cannot be made its owner's only: %s", file, mode, exc)
            else:
                log.warning("%s was mode %04o, open to others: made %04o, its owner's only", file, mode, mode & 0o700)


def _names(tables: Tables) -> dict[str, str]:
    return {name: name for name in tables.names} | {name: texts[0] for name, texts in CLAUSES.items()}


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection, tables: Tables) -> None:
        self._conn = conn
        self._tables = tables
        self._names = _names(tables)
        #: Each query's text with the names bound: a statement of every write costs it otherwise.
        self._texts: dict[str, str] = {}

        #: Inside a write transaction: statements run on the event loop's thread (see ``write``).
        self.inline = False

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        text = self._texts.get(query)
        if text is None:
            if len(self._texts) >= TEXTS_KEPT:  # queries built per call (IN lists) pass through
                self._texts.clear()
            text = self._texts[query] = query.format(**self._names)
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
    """Open with ``await SqliteDb.open(path, tables)``; the tables are created if missing.

    Two connections: one for write transactions and one for reads outside them, so a read
    (a lease renewal's) never waits behind a write's COMMIT, which syncs the file; WAL lets the
    reader see every committed write and never blocks the writer."""

    def __init__(
        self, writer: sqlite3.Connection, reader: sqlite3.Connection, tables: Tables, path: str | Path = ""
    ) -> None:
        self._path = str(path)
        self._conns: tuple[sqlite3.Connection, sqlite3.Connection] | None = (writer, reader)
        self._writer, self._reader = _SqliteTx(writer, tables), _SqliteTx(reader, tables)
        self._tables = tables
        self._write_lock, self._read_lock = anyio.Lock(), anyio.Lock()

    @classmethod
    async def open(cls, path: str | Path, tables: Tables) -> SqliteDb:
        script = "".join(f"{statement.format(**_names(tables))};\n" for statement in tables.ddl)

        def connect(ddl: str) -> sqlite3.Connection:
            conn = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
            )
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(ddl)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            await anyio.to_thread.run_sync(private_file, path)
            writer = await anyio.to_thread.run_sync(connect, script)
        except (sqlite3.Error, OSError) as exc:
            raise RegistryUnavailable(f"cannot open the {tables.what} at {path}: {exc}") from exc
        writer.execute("PRAGMA busy_timeout = 0")  # BEGIN waits in a thread, never inline (_begin)
        try:
            reader = await anyio.to_thread.run_sync(connect, "")
        except sqlite3.Error as exc:
            writer.close()
            raise RegistryUnavailable(f"cannot open the {tables.what} at {path}: {exc}") from exc
        return cls(writer, reader, tables, path)

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[_SqliteTx]:
        async with self._read_lock:
            if self._conns is None:
                raise self._tables.closed()
            yield self._reader

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[Tx]:
        # IMMEDIATE takes the file's write lock before the first read: no writer, in any
        # process, comes between what the transaction reads and what it writes.
        # Only COMMIT (it syncs the file) goes to a worker thread, and BEGIN when another process
        # holds the write lock (it waits for it there); the statements between them hold the
        # write lock and only touch the page cache, so they run inline: one thread hop per
        # statement cost a stop and its audit record 80% more time, and a hop for every BEGIN
        # cost the executor's batches a sixth of the control plane's CPU. A failed COMMIT is
        # rolled back: nothing written.
        async with self._write_lock:
            if self._conns is None:
                raise self._tables.closed()
            tx = self._writer
            await self._begin_immediate()
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

    async def _begin_immediate(self) -> None:
        """``BEGIN IMMEDIATE`` on the writer: at once when the file's write lock is free (the
        writer's busy timeout is 0, so it never waits inline), else in a thread that waits for it
        as long as every other connection would (``BUSY_TIMEOUT_S``)."""
        assert self._conns is not None
        writer = self._conns[0]
        try:
            writer.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # held by another process
                raise self._tables.failed(exc) from exc
        except sqlite3.Error as exc:
            raise self._tables.failed(exc) from exc

        def waiting() -> None:
            writer.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            try:
                writer.execute("BEGIN IMMEDIATE")
            finally:
                writer.execute("PRAGMA busy_timeout = 0")

        try:
            await anyio.to_thread.run_sync(waiting)
        except sqlite3.Error as exc:
            raise self._tables.failed(exc) from exc

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Tx]:
        if self._conns is None:
            raise self._tables.closed()
        try:
            conn = await anyio.to_thread.run_sync(
                lambda: sqlite3.connect(
                    self._path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
                )
            )
        except sqlite3.Error as exc:
            raise self._tables.failed(exc) from exc
        tx = _SqliteTx(conn, self._tables)
        tx.read_only = True
        try:
            await tx.execute("BEGIN")  # WAL: a read transaction sees one committed state
            yield tx
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(conn.close)

    async def follow(self, on_change: Callable[[], None]) -> None:
        # One control plane per file: every write is its own and wakes its watchers directly.
        # Anything else writing the file is picked up by the watch's heartbeat-period re-read.
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        async with self._write_lock, self._read_lock:
            conns, self._conns = self._conns, None
            if conns is not None:
                for conn in conns:
                    await anyio.to_thread.run_sync(conn.close)


class SqliteStore(Store):
    @classmethod
    async def open(cls, path: str | Path) -> Self:
        """The store in the SQLite file at ``path``; its tables are created if missing."""
        return cls(await SqliteDb.open(path, cls.TABLES))
