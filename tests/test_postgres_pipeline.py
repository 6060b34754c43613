"""In a PostgreSQL write transaction, the statements that answer nothing wait for the next one
that answers rows (or a lock, a NOTIFY, the end) and go together in one pipeline
(``haltwire.store.postgres``): fewer round trips, the same order, and a failure among them
still rolls the whole transaction back before its COMMIT."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

from haltwire.store.postgres import PostgresDb
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import Tables
from harness import postgres_section
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

TABLES = Tables("pipeline", "pipeline test store", ("numbers",), ("CREATE TABLE IF NOT EXISTS {numbers} (n BIGINT PRIMARY KEY)",))
INSERT = "INSERT INTO {numbers} (n) VALUES (?)"
COUNT = "SELECT count(*) FROM {numbers}"


@asynccontextmanager
async def proxied_db() -> AsyncIterator[tuple[PostgresDb, TcpProxy]]:
    """A ``PostgresDb`` on a fresh schema, reached through a proxy that counts the server's replies."""
    with postgres_section("test_pipeline") as section:
        url = urlsplit(section["url"])
        async with TcpProxy.running(url.port or 5432, url.hostname or "127.0.0.1") as proxy:
            netloc = f"{url.username or 'postgres'}@127.0.0.1:{proxy.port}"
            db = await PostgresDb.open(urlunsplit(url._replace(netloc=netloc)), section["schema"], 5.0, "test", TABLES)
            try:
                yield db, proxy
            finally:
                await db.aclose()


async def test_statements_that_answer_nothing_go_together_in_order() -> None:
    async with proxied_db() as (db, proxy):
        async with db.write() as tx:
            before = proxy.replies
            for n in range(40):
                await tx.execute(INSERT, (n,))
            assert proxy.replies == before  # nothing sent yet: nothing answered
            # A statement that answers rows sees every one before it, sent in one pipeline.
            assert await tx.all(COUNT) == [(40,)]
            assert proxy.replies - before < 10, proxy.replies - before  # one at a time: 40 or more
        assert await db.all(COUNT) == [(40,)]


async def test_a_failure_among_them_rolls_back_before_commit_and_says_nothing_was_written() -> None:
    async with proxied_db() as (db, _):
        await db.execute(INSERT, (7,))  # outside a transaction: at once
        with pytest.raises(RegistryUnavailable) as failed:
            async with db.write() as tx:
                for n in (1, 2, 7, 3):  # 7 is taken: the third statement fails, at the block's end
                    await tx.execute(INSERT, (n,))
        assert failed.value.written is False  # rolled back before COMMIT: nothing, not "unknown"
        assert await db.all("SELECT n FROM {numbers} ORDER BY n") == [(7,)]
        async with db.write() as tx:  # the connection is whole again
            await tx.execute(INSERT, (8,))
        assert await db.all(COUNT) == [(2,)]
