"""SQLite write transactions begin on the event loop when the file's write lock is free, and wait
for another process's lock in a thread, as long as any connection would, without stalling the
loop (``SqliteDb._begin``)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from haltwire.store.registry import RegistryUnavailable
from haltwire.store.sql import Db, Tables
from haltwire.store.sqlite import SqliteDb

pytestmark = pytest.mark.anyio

TABLES = Tables("test", "test store", ("notes",), ("CREATE TABLE IF NOT EXISTS {notes} (n INTEGER)",))


async def note(db: Db, n: int) -> None:
    async with db.write() as tx:
        await tx.execute("INSERT INTO {notes} (n) VALUES (?)", (n,))


async def test_a_write_waits_for_another_connections_lock_without_stalling_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = await SqliteDb.open(path, TABLES)
    other = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)  # another process's
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    try:
        other.execute("BEGIN IMMEDIATE")
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticking)
            with anyio.fail_after(5):
                async with anyio.create_task_group() as writers:
                    writers.start_soon(note, db, 1)
                    await anyio.sleep(0.3)
                    assert await db.all("SELECT n FROM {notes}") == []  # still waiting
                    other.execute("COMMIT")
            tg.cancel_scope.cancel()
        assert ticks >= 15  # the loop ran while the write waited
        assert await db.all("SELECT n FROM {notes}") == [(1,)]
        await note(db, 2)  # and the next begins at once again
        assert await db.all("SELECT n FROM {notes} ORDER BY n") == [(1,), (2,)]
    finally:
        other.close()
        await db.aclose()


async def test_a_write_lock_held_past_the_busy_timeout_fails_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("haltwire.store.sqlite.BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "db.sqlite"
    db = await SqliteDb.open(path, TABLES)
    other = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="locked"):
            await note(db, 1)
        assert time.monotonic() - started >= 0.15
        other.execute("ROLLBACK")
        await note(db, 2)
        assert await db.all("SELECT n FROM {notes}") == [(2,)]
    finally:
        other.close()
        await db.aclose()
