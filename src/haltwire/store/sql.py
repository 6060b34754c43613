"""Connection plumbing shared by the SQL stores (the registry and the audit log).

``SqliteConnection``: one stdlib ``sqlite3`` connection in WAL mode with ``synchronous=FULL``,
used from a worker thread under one lock. ``PostgresConnection``: one psycopg connection under
one lock, replaced on next use after it breaks. Both raise ``RegistryUnavailable`` for any
driver failure; ``what`` names the store in messages ("registry", "audit log") and ``store``
prefixes failures ("registry store failed: ...").
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import psycopg
from psycopg import sql

from haltwire.store.registry import RegistryUnavailable

T = TypeVar("T")
log = logging.getLogger("haltwire.store")
_LISTEN_RETRY_MIN_S = 0.2
_LISTEN_RETRY_MAX_S = 5.0
PgConn = psycopg.AsyncConnection[tuple[Any, ...]]


class SqliteConnection:
    """Open with ``await SqliteConnection.open(path, schema_script, what=..., store=...)``."""

    def __init__(self, conn: sqlite3.Connection, what: str, store: str) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = anyio.Lock()
        self._what = what
        self._store = store

    @classmethod
    async def open(cls, path: str | Path, schema: str, *, what: str, store: str) -> SqliteConnection:
        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(schema)
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            return cls(await anyio.to_thread.run_sync(connect), what, store)
        except sqlite3.Error as exc:
            raise RegistryUnavailable(f"cannot open the {what} at {path}: {exc}") from exc

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in a worker thread under the lock."""
        async with self._lock:
            conn = self._conn
            if conn is None:
                raise RegistryUnavailable(f"the {self._what} is closed")
            try:
                return await anyio.to_thread.run_sync(fn, conn)
            except sqlite3.Error as exc:
                raise RegistryUnavailable(f"{self._store} store failed: {exc}") from exc

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await anyio.to_thread.run_sync(conn.close)


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class PostgresConnection:
    """Open with ``await PostgresConnection.open(url, schema, ...)``; the schema is created if missing."""

    def __init__(
        self, url: str, connect_timeout: float, application_name: str, *, what: str, store: str
    ) -> None:
        self._url = url
        self._application_name = application_name
        self._timeout = connect_timeout
        self._what = what
        self._store = store
        self._conn: PgConn | None = None
        self._closed = False
        self._lock = anyio.Lock()

    @classmethod
    async def open(
        cls,
        url: str,
        schema: str,
        connect_timeout: float,
        application_name: str,
        *,
        lock_key: sql.Composed,
        ddl: list[sql.Composed],
        what: str,
        store: str,
    ) -> PostgresConnection:
        """Connect, then create ``schema`` and run ``ddl`` in one transaction under ``lock_key``."""
        db = cls(url, connect_timeout, application_name, what=what, store=store)
        async with db.transaction(lock_key) as conn:
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            for statement in ddl:
                await conn.execute(statement)
        return db

    async def _connection(self) -> PgConn:
        if self._closed:
            raise RegistryUnavailable(f"the {self._what} is closed")
        if self._conn is None or self._conn.broken or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                connect_timeout=max(1, round(self._timeout)),
                application_name=self._application_name,
            )
        return self._conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[PgConn]:
        """The connection, held under the lock; driver failures become ``RegistryUnavailable``."""
        async with self._lock:
            try:
                with anyio.fail_after(self._timeout * 2):
                    yield await self._connection()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                await self._discard()  # its state is unknown: the next call reconnects
                raise RegistryUnavailable(f"{self._store} store failed: {exc}") from exc

    @contextlib.asynccontextmanager
    async def transaction(self, lock_key: sql.Composed) -> AsyncIterator[PgConn]:
        """A transaction that first takes the advisory transaction lock ``lock_key``."""
        async with self.connection() as conn, conn.transaction():
            await conn.execute(lock_key)
            yield conn

    async def fetchall(self, query: sql.Composed, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        async with self.connection() as conn:
            return await (await conn.execute(query, params)).fetchall()

    async def listen(self, channel: str, on_notify: Callable[[], None]) -> None:
        """Call ``on_notify`` for every NOTIFY on ``channel``, for as long as the caller's task runs.

        A separate connection (LISTEN holds it). After it breaks, it reconnects with a backoff
        and calls ``on_notify`` once listening again, since a NOTIFY sent while no one
        listened is lost. It ends when cancelled (by its owner's task group) or once closed.
        """
        delay = _LISTEN_RETRY_MIN_S
        while not self._closed:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url,
                    autocommit=True,
                    connect_timeout=max(1, round(self._timeout)),
                    application_name=f"{self._application_name}-listen",
                )
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    delay = _LISTEN_RETRY_MIN_S
                    on_notify()
                    async for _ in conn.notifies():
                        on_notify()
            except (psycopg.Error, OSError) as exc:
                log.warning("%s: LISTEN %s failed (%s); retrying in %.1f s", self._what, channel, exc, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, _LISTEN_RETRY_MAX_S)

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            await self._discard()


def table_queries(table: sql.Identifier, lock_name: str, texts: dict[str, str]) -> dict[str, sql.Composed]:
    """Each query text with ``{t}`` bound to ``table`` and ``{name}`` to the advisory lock's name."""
    return {name: sql.SQL(text).format(t=table, name=sql.Literal(lock_name)) for name, text in texts.items()}


#: A transaction-scoped advisory lock; ``{name}`` is bound to a literal.
ADVISORY_LOCK = "SELECT pg_advisory_xact_lock(hashtext({name}))"


def advisory_lock(name: str) -> sql.Composed:
    return sql.SQL(ADVISORY_LOCK).format(name=sql.Literal(name))


class SharedQueries:
    """Query texts a PostgreSQL store shares with its SQLite twin (``?`` placeholders,
    ``{name}`` placeholders for tables and clauses), bound for psycopg in one schema."""

    def __init__(self, schema: str, names: Mapping[str, sql.Composable]) -> None:
        self.schema = schema
        self._names = names

    def bind(self, text: str) -> sql.Composed:
        return sql.SQL(text.replace("?", "%s")).format(**self._names)

    def bind_all(self, texts: Mapping[str, str]) -> dict[str, sql.Composed]:
        return {name: self.bind(text) for name, text in texts.items()}

    async def connect(
        self,
        url: str,
        connect_timeout: float,
        application_name: str,
        *,
        ddl: Sequence[str],
        what: str,
        store: str,
    ) -> PostgresConnection:
        """Connect and create the schema and ``ddl``, under a lock named for the store and the
        schema: replicas starting together must not race ``CREATE INDEX``."""
        return await PostgresConnection.open(
            url,
            self.schema,
            connect_timeout,
            application_name,
            lock_key=advisory_lock(f"haltwire.{store}:{self.schema}"),
            ddl=[self.bind(statement) for statement in ddl],
            what=what,
            store=store,
        )
