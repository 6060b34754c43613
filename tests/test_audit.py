"""The audit log: append-only, hash-chained, for SQLite (a temporary file) and PostgreSQL.

Storage tests run against both backends; tampering is done with raw SQL on the ``audit``
table, the way someone with database access would. ``verify`` is also tested on its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import psycopg
import pytest
from psycopg import sql

from haltwire.store.audit import GENESIS, AuditLog, AuditRecord, hash_of, verify
from haltwire.store.audit.postgres import PostgresAuditLog
from haltwire.store.audit.sqlite import SqliteAuditLog
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.registry.postgres import PostgresRegistry
from haltwire.store.registry.sqlite import SqliteRegistry
from harness import drop_schema, postgres_url, service_missing

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0


@dataclass
class Backend:
    log: AuditLog
    #: Runs raw SQL statements (naming the table ``audit``) straight on the store, outside the log.
    raw: Callable[[str], None]
    name: str


def sqlite_raw(path: Path) -> Callable[[str], None]:
    def run(statements: str) -> None:
        conn = sqlite3.connect(str(path), isolation_level=None)
        try:
            conn.executescript(statements)
        finally:
            conn.close()

    return run


def postgres_raw(schema: str) -> Callable[[str], None]:
    def run(statements: str) -> None:
        with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for statement in statements.split(";"):
                if statement.strip():
                    conn.execute(statement.encode())

    return run


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "audit.db"
        log: AuditLog = await SqliteAuditLog.open(path)
        yield Backend(log, sqlite_raw(path), "sqlite")
        await log.aclose()
        return
    schema = f"test_audit_{uuid.uuid4().hex[:12]}"
    try:
        log = await PostgresAuditLog.open(postgres_url(), schema=schema)
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        yield Backend(log, postgres_raw(schema), "postgres")
    finally:
        await log.aclose()
        drop_schema(schema)


async def fill(log: AuditLog, n: int) -> list[AuditRecord]:
    out = []
    for i in range(n):
        refused = i % 4 == 3
        out.append(
            await log.append(
                f"user{i % 3}",
                "operator" if i % 2 else "admin",
                "stop.clear.refused" if refused else "stop.issue",
                f"stp_{i % 5:016x}",
                "refused" if refused else "ok",
                f"reason {i}",
                {"i": i, "scope": f"tenant:t{i}", "nested": {"list": [1, 2.5, None, "é"]}},
                now=NOW + i,
            )
        )
    return out


async def test_appends_chain(backend: Backend) -> None:
    assert await backend.log.records() == []
    assert verify([]).ok
    appended = await fill(backend.log, 20)
    assert [r.seq for r in appended] == list(range(1, 21))
    assert appended[0].prev_hash == GENESIS
    for before, after in itertools.pairwise(appended):
        assert after.prev_hash == before.hash
    assert all(r.hash == hash_of(r) and len(r.hash) == 64 for r in appended)
    stored = await backend.log.records()
    assert stored == appended
    assert stored[3].outcome == "refused" and stored[3].action == "stop.clear.refused"
    assert stored[0].detail == {"i": 0, "scope": "tenant:t0", "nested": {"list": [1, 2.5, None, "é"]}}
    assert verify(stored) == verify(appended)
    result = verify(stored)
    assert (result.ok, result.checked, result.first_bad_seq, result.problem) == (True, 20, None, None)


async def test_concurrent_appends_are_serialized(backend: Backend) -> None:
    seqs: list[int] = []

    async def append(i: int) -> None:
        record = await backend.log.append(
            "tripwire", "system", "stop.issue", f"run:r{i}", "ok", "x", {}, now=NOW
        )
        seqs.append(record.seq)

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(append, i)
    assert sorted(seqs) == list(range(1, 31))
    stored = await backend.log.records()
    assert [r.seq for r in stored] == list(range(1, 31))
    assert verify(stored).ok and verify(stored).checked == 30


async def test_records_filters(backend: Backend) -> None:
    await fill(backend.log, 20)
    mine = await backend.log.records(target=f"stp_{2:016x}")
    assert [r.seq for r in mine] == [3, 8, 13, 18]
    assert [r.seq for r in await backend.log.records(target=f"stp_{2:016x}", since_seq=8)] == [13, 18]
    assert [r.seq for r in await backend.log.records(target=f"stp_{2:016x}", limit=3)] == [3, 8, 13]
    assert [r.seq for r in await backend.log.records(since_seq=17)] == [18, 19, 20]
    assert [r.seq for r in await backend.log.records(since_seq=5, limit=2)] == [6, 7]
    assert await backend.log.records(limit=0) == []
    assert await backend.log.records(target="nobody") == []
    assert await backend.log.records(since_seq=20) == []


async def test_changed_field_is_detected(backend: Backend) -> None:
    await fill(backend.log, 10)
    backend.raw("UPDATE audit SET reason = 'x' WHERE seq = 5")
    result = verify(await backend.log.records())
    assert not result.ok and result.first_bad_seq == 5 and result.checked == 4
    assert result.problem is not None and "hash mismatch" in result.problem


async def test_changed_detail_is_detected(backend: Backend) -> None:
    await fill(backend.log, 10)
    backend.raw("""UPDATE audit SET detail = '{"i":6,"scope":"tenant:other"}' WHERE seq = 7""")
    stored = await backend.log.records()
    assert stored[6].detail == {"i": 6, "scope": "tenant:other"}
    result = verify(stored)
    assert not result.ok and result.first_bad_seq == 7
    assert result.problem is not None and "hash mismatch" in result.problem


async def test_unreadable_detail_is_detected_not_a_crash(backend: Backend) -> None:
    await fill(backend.log, 4)
    backend.raw("UPDATE audit SET detail = 'not json' WHERE seq = 2")
    result = verify(await backend.log.records())
    assert not result.ok and result.first_bad_seq == 2


async def test_deleted_record_is_detected(backend: Backend) -> None:
    await fill(backend.log, 10)
    backend.raw("DELETE FROM audit WHERE seq = 5")
    result = verify(await backend.log.records())
    assert not result.ok and result.first_bad_seq == 5 and result.checked == 4
    assert result.problem is not None and "gap" in result.problem and "5" in result.problem


async def test_deleted_first_record_is_detected(backend: Backend) -> None:
    await fill(backend.log, 3)
    backend.raw("DELETE FROM audit WHERE seq = 1")
    result = verify(await backend.log.records())
    assert not result.ok and result.first_bad_seq == 1 and result.checked == 0


async def test_swapped_seqs_are_detected(backend: Backend) -> None:
    await fill(backend.log, 10)
    backend.raw(
        "UPDATE audit SET seq = -1 WHERE seq = 3; UPDATE audit SET seq = 3 WHERE seq = 7;"
        " UPDATE audit SET seq = 7 WHERE seq = -1"
    )
    stored = await backend.log.records()
    assert [r.seq for r in stored] == list(range(1, 11))
    result = verify(stored)
    assert not result.ok and result.first_bad_seq == 3 and result.checked == 2


async def test_append_validates(backend: Backend) -> None:
    with pytest.raises(ValueError):
        await backend.log.append("alice", "admin", "stop.issue", "global", "maybe", "r", {}, now=NOW)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await backend.log.append(" ", "admin", "stop.issue", "global", "ok", "r", {}, now=NOW)
    with pytest.raises(ValueError):
        await backend.log.append("alice", "admin", "", "global", "ok", "r", {}, now=NOW)
    with pytest.raises(TypeError):
        await backend.log.append(
            "alice", "admin", "stop.issue", "global", "ok", "r", {"x": object()}, now=NOW
        )
    with pytest.raises(ValueError):
        await backend.log.append(
            "alice", "admin", "stop.issue", "global", "ok", "r", {"x": float("nan")}, now=NOW
        )
    assert await backend.log.records() == []


async def test_closed_log_is_unavailable(backend: Backend) -> None:
    await backend.log.aclose()
    with pytest.raises(RegistryUnavailable):
        await backend.log.append("alice", "admin", "stop.issue", "global", "ok", "r", {}, now=NOW)
    with pytest.raises(RegistryUnavailable):
        await backend.log.records()


async def test_shares_the_registry_database(tmp_path: Path) -> None:
    path = tmp_path / "haltwire.db"
    registry = await SqliteRegistry.open(path)
    log = await SqliteAuditLog.open(path)
    try:
        stop = await registry.issue_stop("global", "incident", "alice", now=NOW)
        await log.append("alice", "admin", "stop.issue", stop.stop_id, "ok", "incident", {}, now=NOW)
        assert await registry.revision() == 1
        assert [r.target for r in await log.records()] == [stop.stop_id]
    finally:
        await log.aclose()
        await registry.aclose()
    reopened = await SqliteAuditLog.open(path)
    try:
        assert verify(await reopened.records()).checked == 1
    finally:
        await reopened.aclose()


async def test_shares_the_registry_schema() -> None:
    schema = f"test_audit_{uuid.uuid4().hex[:12]}"
    try:
        registry = await PostgresRegistry.open(postgres_url(), schema=schema)
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        log = await PostgresAuditLog.open(postgres_url(), schema=schema)
        try:
            stop = await registry.issue_stop("global", "incident", "alice", now=NOW)
            await log.append("alice", "admin", "stop.issue", stop.stop_id, "ok", "incident", {}, now=NOW)
            assert await registry.revision() == 1
            assert verify(await log.records(target=stop.stop_id)).checked == 1
        finally:
            await log.aclose()
    finally:
        await registry.aclose()
        drop_schema(schema)


async def test_postgres_down_is_unavailable() -> None:
    with pytest.raises(RegistryUnavailable):
        await PostgresAuditLog.open(
            "postgresql://postgres@127.0.0.1:1/test", schema="never", connect_timeout=2
        )


async def test_sqlite_unopenable_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RegistryUnavailable):
        await SqliteAuditLog.open(tmp_path / "no" / "such" / "dir" / "audit.db")


# -- verify on its own -------------------------------------------------------------------------


async def chain(n: int) -> list[AuditRecord]:
    log = await SqliteAuditLog.open(":memory:")
    try:
        return await fill(log, n)
    finally:
        await log.aclose()


async def test_verify_reordered_list() -> None:
    records = await chain(6)
    swapped = [records[0], records[1], records[3], records[2], records[4], records[5]]
    result = verify(swapped)
    assert not result.ok and result.first_bad_seq == 3 and result.checked == 2
    assert result.problem is not None and "gap" in result.problem
    backwards = verify(list(reversed(records)))
    assert not backwards.ok and backwards.first_bad_seq == 1


async def test_verify_duplicate_is_not_increasing() -> None:
    records = await chain(4)
    result = verify([*records[:3], records[2], records[3]])
    assert not result.ok and result.first_bad_seq == 3 and result.checked == 3
    assert result.problem is not None and "not increasing" in result.problem


async def test_verify_rehashed_record_breaks_the_next_link() -> None:
    records = await chain(6)
    forged = dataclasses.replace(records[2], reason="forged")
    forged = dataclasses.replace(forged, hash=hash_of(forged))  # consistent on its own
    result = verify([*records[:2], forged, *records[3:]])
    assert not result.ok and result.first_bad_seq == 4 and result.checked == 3
    assert result.problem is not None and "prev_hash" in result.problem


async def test_verify_wrong_genesis() -> None:
    (first,) = await chain(1)
    moved = dataclasses.replace(first, prev_hash="1" * 64)
    moved = dataclasses.replace(moved, hash=hash_of(moved))
    result = verify([moved])
    assert not result.ok and result.first_bad_seq == 1 and result.problem is not None
    assert "genesis" in result.problem


async def test_verify_accepts_a_generator_and_each_field_matters() -> None:
    records = await chain(3)
    assert verify(r for r in records).checked == 3
    changes: dict[str, object] = {
        "at": NOW + 0.5,
        "actor": "mallory",
        "role": "admin!",
        "action": "stop.clear",
        "target": "global",
        "outcome": "ok" if records[1].outcome == "refused" else "refused",
        "reason": "other",
        "detail": {},
        "at_nan": float("nan"),
    }
    for field, value in changes.items():
        changed = dataclasses.replace(records[1], **{field.removesuffix("_nan"): value})  # type: ignore[arg-type]
        result = verify([records[0], changed, records[2]])
        assert (result.ok, result.first_bad_seq) == (False, 2), field
