"""The PostgreSQL backend of the SQL stores: two psycopg connections per ``Db``, in one schema.

One connection for write transactions, one for reads outside them, each held under a lock,
one statement or transaction at a time, and replaced on next use after it breaks.
Transactions serialize with other replicas' through transaction-scoped advisory locks named
for the store and the schema; ``follow`` listens for the NOTIFY that ``Tx.notify`` sends at
commit. A COMMIT whose answer is lost raises ``RegistryUnavailable`` with ``written=None``.

In a write transaction, a statement that answers nothing (``execute``: an audit record, its
index rows, most updates) is not sent on its own: it waits for the transaction's next statement
that answers rows, its next lock or NOTIFY, or its end, and then all that wait go in one
pipeline (one round trip). They run in the order written; a failure among them surfaces at that
point, still before COMMIT, and rolls the whole transaction back as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

import anyio
import psycopg
from psycopg import sql

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import CLAUSES, Db, Params, Row, Store, Tables, Tx

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
log = logging.getLogger("haltwire.store")
_LISTEN_RETRY_MIN_S = 0.2
_LISTEN_RETRY_MAX_S = 5.0
_BOUND_MAX = 256  # query texts kept bound; the texts of a store are a few dozen
_DEFERRED_MAX = 200  # statements a write transaction holds back at most before sending them
PgConn = psycopg.AsyncConnection[tuple[Any, ...]]


def notify_channel(store: str, schema: str) -> str:
    """The NOTIFY channel of ``store`` in ``schema`` (identifiers stop at 63 bytes)."""
    return f"haltwire_{store}_{schema}"[:63]


def advisory_lock(name: str) -> sql.Composed:
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtext({name}))").format(name=sql.Literal(name))


class _PostgresTx(Tx):
    def __init__(self, conn: PgConn, db: PostgresDb, *, deferring: bool = False) -> None:
        self.conn = conn
        self._db = db
        #: A write transaction's statements that answer nothing, not sent yet (the module's
        #: docstring); None outside write transactions: every statement is sent at once.
        self._deferred: list[tuple[sql.Composed, Params]] | None = [] if deferring else None

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        await self.flush()
        cur = await self.conn.execute(self._db.bind(query), params)
        return await cur.fetchall() if cur.description is not None else []

    async def execute(self, query: str, params: Params = ()) -> None:
        if self._deferred is None:
            await self.all(query, params)
            return
        self._deferred.append((self._db.bind(query), params))
        if len(self._deferred) >= _DEFERRED_MAX:
            await self.flush()

    async def flush(self) -> None:
        """Send the statements waiting, in order, in one pipeline; raises what the first failed with."""
        if not self._deferred:
            return
        waiting, self._deferred = self._deferred, []
        if len(waiting) == 1:
            await self.conn.execute(*waiting[0])
            return
        async with self.conn.pipeline():
            for query, params in waiting:
                await self.conn.execute(query, params)

    async def lock(self, name: str, *parts: str) -> None:
        await self.flush()
        await self.conn.execute(advisory_lock(":".join((f"haltwire.{name}", self._db.schema, *parts))))

    async def notify(self, payload: str) -> None:
        await self.flush()
        await self.conn.execute(self._db.notify_query, (payload,))


class PostgresDb(Db):
    """Open with ``await PostgresDb.open(url, schema, ...)``; the schema and tables are created if missing."""

    def __init__(
        self, url: str, schema: str, connect_timeout: float, application_name: str, tables: Tables
    ) -> None:
        # How this store connects: its connection, and LISTEN's (named "<application_name>-listen").
        self._connect = functools.partial(
            psycopg.AsyncConnection.connect,
            url,
            autocommit=True,
            connect_timeout=max(1, round(connect_timeout)),
        )
        self._application_name, self._timeout = application_name, connect_timeout
        self.schema, self._tables = schema, tables
        self._names: dict[str, sql.Composable] = {name: sql.Identifier(schema, name) for name in tables.names}
        self._names |= {name: sql.SQL(texts[1]) for name, texts in CLAUSES.items()}
        self._names["schema"] = sql.Identifier(schema)
        self._bound: dict[str, sql.Composed] = {}
        self.channel = notify_channel(tables.store, schema)
        # Delivered to every LISTENing replica when the writing transaction commits.
        self.notify_query = sql.SQL("SELECT pg_notify({}, %s)").format(sql.Literal(self.channel))
        self._conns: dict[str, PgConn] = {}
        self._closed = False
        self._locks = {"read": anyio.Lock(), "write": anyio.Lock()}

    @classmethod
    async def open(
        cls, url: str, schema: str, connect_timeout: float, application_name: str, tables: Tables
    ) -> PostgresDb:
        """Connect, then create the schema and the tables in one transaction under the store's
        lock: replicas starting together must not race ``CREATE INDEX``."""
        db = cls(url, schema, connect_timeout, application_name, tables)
        async with db.write(tables.store) as tx:
            for statement in ("CREATE SCHEMA IF NOT EXISTS {schema}", *tables.ddl):
                await tx.execute(statement)
        return db

    def bind(self, text: str) -> sql.Composed:
        """``text`` for psycopg: ``%s`` placeholders, names bound in this schema."""
        bound = self._bound.get(text)
        if bound is None:
            bound = sql.SQL(text.replace("?", "%s")).format(**self._names)
            if len(self._bound) < _BOUND_MAX:
                self._bound[text] = bound
        return bound

    async def _connection(self, role: str) -> PgConn:
        if self._closed:
            raise self._tables.closed()
        conn = self._conns.get(role)
        if conn is None or conn.broken or conn.closed:
            conn = self._conns[role] = await self._connect(application_name=self._application_name)
        return conn

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[_PostgresTx]:
        """The read connection, held under its lock; driver failures become ``RegistryUnavailable``."""
        async with self._locks["read"]:
            try:
                with anyio.fail_after(self._timeout * 2):
                    yield _PostgresTx(await self._connection("read"), self)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                await self._discard("read")  # its state is unknown: the next call reconnects
                raise self._tables.failed(exc) from exc

    async def all(self, query: str, params: Params = ()) -> list[Row]:
        # A read on a connection the server dropped (a restart, a failover, an idle timeout)
        # is sent once more on a new one: reads repeat safely.
        try:
            return await super().all(query, params)
        except RegistryUnavailable as exc:
            if not isinstance(exc.__cause__, psycopg.OperationalError) or self._joined() is not None:
                raise
        return await super().all(query, params)

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[Tx]:
        """A transaction on the write connection. A failure before COMMIT rolled it back; one
        during COMMIT (the connection lost, the deadline passed) leaves its outcome unknown.
        A connection the server dropped is found at BEGIN, before anything was sent: replaced once."""
        committing = False
        async with self._locks["write"]:
            try:
                with anyio.fail_after(self._timeout * 2):
                    conn = await self._began()
                    tx = _PostgresTx(conn, self, deferring=True)
                    try:
                        yield tx
                        await tx.flush()  # still before COMMIT: a failure here rolls back
                    except BaseException:
                        with anyio.CancelScope(shield=True):
                            try:
                                await conn.execute("ROLLBACK")
                            except (psycopg.Error, OSError):
                                await self._discard("write")  # lost with its transaction
                        raise
                    committing = True
                    await conn.execute("COMMIT")
            except (psycopg.Error, OSError, TimeoutError) as exc:
                await self._discard("write")
                raise (self._tables.commit_lost(exc) if committing else self._tables.failed(exc)) from exc

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Tx]:
        if self._closed:
            raise self._tables.closed()
        try:
            conn = await self._connect(application_name=f"{self._application_name}-snapshot")
        except (psycopg.Error, OSError) as exc:
            raise self._tables.failed(exc) from exc
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            tx = _PostgresTx(conn, self)
            tx.read_only = True
            yield tx
        except (psycopg.Error, OSError) as exc:
            raise self._tables.failed(exc) from exc
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def _began(self) -> PgConn:
        """The write connection, in a transaction just begun."""
        try:
            conn = await self._connection("write")
            await conn.execute("BEGIN")
        except psycopg.OperationalError:
            await self._discard("write")
            conn = await self._connection("write")
            await conn.execute("BEGIN")
        return conn

    async def follow(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` for every NOTIFY on the store's channel, and once listening again
        after a broken connection (a NOTIFY sent while no one listened is lost).

        A separate connection (LISTEN holds it), reconnecting with a backoff. It ends when
        cancelled (by its owner's task group) or once closed.
        """
        delay = _LISTEN_RETRY_MIN_S
        while not self._closed:
            try:
                conn = await self._connect(application_name=f"{self._application_name}-listen")
                async with conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    delay = _LISTEN_RETRY_MIN_S
                    on_change()
                    async for _ in conn.notifies():
                        on_change()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "%s: LISTEN %s failed (%s); retrying in %.1f s",
                    self._tables.what,
                    self.channel,
                    exc,
                    delay,
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, _LISTEN_RETRY_MAX_S)

    async def _discard(self, role: str) -> None:
        conn = self._conns.pop(role, None)
        if conn is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def aclose(self) -> None:
        async with self._locks["write"], self._locks["read"]:
            self._closed = True
            for role in list(self._conns):
                await self._discard(role)


class PostgresStore(Store):
    @classmethod
    async def open(
        cls,
        url: str = DEFAULT_URL,
        *,
        schema: str = "haltwire",
        connect_timeout: float = 5.0,
        application_name: str | None = None,
    ) -> Self:
        """The store in ``schema`` (default application name ``haltwire-<store>``); the schema
        and the tables are created if missing."""
        name = f"haltwire-{cls.TABLES.store}" if application_name is None else application_name
        return cls(await PostgresDb.open(url, schema, connect_timeout, name, cls.TABLES))
