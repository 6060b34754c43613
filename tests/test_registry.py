"""The ``Registry`` contract, for SQLite (a temporary file) and PostgreSQL (a real server).

Every contract test runs against both backends. Time is the ``now`` argument, never a sleep.
PostgreSQL tests use a unique schema on the shared server and drop it afterwards.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import psycopg
import pytest

from haltwire.scope import ScopeError
from haltwire.store.registry import AlreadyCleared, Registry, RegistryUnavailable, UnknownStop
from haltwire.store.registry.postgres import PostgresRegistry
from haltwire.store.registry.sqlite import SqliteRegistry
from harness import drop_schema, postgres_url, service_missing

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
async def registry(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Registry]:
    if request.param == "sqlite":
        reg: Registry = await SqliteRegistry.open(tmp_path / "registry.db")
        yield reg
        await reg.aclose()
        return
    schema = f"test_registry_{uuid.uuid4().hex[:12]}"
    try:
        reg = await PostgresRegistry.open(postgres_url(), schema=schema)
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        yield reg
    finally:
        await reg.aclose()
        drop_schema(schema)


async def test_issue_get_and_active(registry: Registry) -> None:
    assert await registry.revision() == 0
    assert await registry.active_stops(now=NOW) == []
    stop = await registry.issue_stop("tenant:acme", "runaway spend", "alice", now=NOW)
    assert stop.stop_id.startswith("stp_") and len(stop.stop_id) == 20
    int(stop.stop_id[4:], 16)
    assert (stop.scope, stop.reason, stop.issued_by, stop.issued_at) == (
        "tenant:acme",
        "runaway spend",
        "alice",
        NOW,
    )
    assert stop.expires_at is None and stop.revision == 1 and not stop.cleared
    assert await registry.get_stop(stop.stop_id) == stop
    assert await registry.get_stop("stp_0000000000000000") is None
    assert await registry.active_stops(now=NOW + 1) == [stop]
    assert await registry.revision() == 1


async def test_clear_records_who_and_why(registry: Registry) -> None:
    stop = await registry.issue_stop("global", "incident 42", "alice", now=NOW)
    other = await registry.issue_stop("tool:delete_db", "never", "alice", now=NOW)
    with pytest.raises(ValueError):
        await registry.clear_stop(stop.stop_id, "bob", "  ", now=NOW + 5)
    cleared = await registry.clear_stop(stop.stop_id, "bob", "root cause fixed", now=NOW + 5)
    assert (cleared.cleared_by, cleared.cleared_at, cleared.clear_reason) == (
        "bob",
        NOW + 5,
        "root cause fixed",
    )
    assert cleared.cleared_revision == 3 and cleared.revision == 1
    assert cleared.reason == "incident 42" and cleared.issued_by == "alice"
    assert await registry.get_stop(stop.stop_id) == cleared
    assert await registry.active_stops(now=NOW + 6) == [other]
    with pytest.raises(AlreadyCleared):
        await registry.clear_stop(stop.stop_id, "carol", "again", now=NOW + 7)
    with pytest.raises(UnknownStop):
        await registry.clear_stop("stp_ffffffffffffffff", "bob", "no such stop", now=NOW)
    assert await registry.revision() == 3
    assert await registry.all_stops() == [cleared, other]


async def test_expiry_is_judged_at_now(registry: Registry) -> None:
    stop = await registry.issue_stop("run:r1", "cool down", "tripwire", now=NOW, expires_at=NOW + 60)
    assert stop.expires_at == NOW + 60
    assert await registry.active_stops(now=NOW + 59.9) == [stop]
    assert await registry.active_stops(now=NOW + 60) == []
    assert await registry.active_stops(now=NOW + 3600) == []
    assert await registry.get_stop(stop.stop_id) == stop  # expired, still on record


@pytest.mark.parametrize("scope", ["", "nonsense", "tenant:", "global:x", "version:agent", "run: padded"])
async def test_bad_scope_rejected(registry: Registry, scope: str) -> None:
    with pytest.raises(ScopeError):
        await registry.issue_stop(scope, "reason", "alice", now=NOW)
    assert await registry.revision() == 0


async def test_empty_reason_rejected(registry: Registry) -> None:
    for reason in ("", "   "):
        with pytest.raises(ValueError):
            await registry.issue_stop("global", reason, "alice", now=NOW)
    assert await registry.revision() == 0


async def test_changes_since_is_exact_and_ordered(registry: Registry) -> None:
    stops = [await registry.issue_stop(f"agent:a{i}", f"r{i}", "alice", now=NOW + i) for i in range(5)]
    await registry.clear_stop(stops[1].stop_id, "bob", "fixed", now=NOW + 10)
    await registry.clear_stop(stops[3].stop_id, "bob", "fixed too", now=NOW + 11)
    assert await registry.revision() == 7
    every = await registry.changes_since(0)
    assert [c.revision for c in every] == [1, 2, 3, 4, 5, 6, 7]
    assert [c.kind for c in every] == ["stop"] * 5 + ["clear"] * 2
    later = await registry.changes_since(3)
    assert [c.revision for c in later] == [4, 5, 6, 7]
    assert [c.stop.stop_id for c in later] == [
        stops[3].stop_id,
        stops[4].stop_id,
        stops[1].stop_id,
        stops[3].stop_id,
    ]
    assert later[2].stop.cleared_revision == 6 and later[2].stop.clear_reason == "fixed"
    assert [c.revision for c in await registry.changes_since(3, limit=2)] == [4, 5]
    assert await registry.changes_since(7) == []


async def test_history_is_append_only(registry: Registry) -> None:
    stop = await registry.issue_stop("tenant:acme", "spend", "alice", now=NOW)
    await registry.clear_stop(stop.stop_id, "bob", "ok now", now=NOW + 1)
    first, second = await registry.changes_since(0)
    assert first.kind == "stop" and first.stop == stop
    assert first.stop.cleared_by is None and first.stop.cleared_at is None
    assert first.stop.clear_reason is None and first.stop.cleared_revision is None
    assert second.kind == "clear" and second.stop.cleared_by == "bob" and second.stop.revision == 1


async def test_concurrent_issues_get_consecutive_revisions(registry: Registry) -> None:
    revisions: list[int] = []

    async def issue(i: int) -> None:
        stop = await registry.issue_stop(f"run:r{i}", "parallel", "tripwire", now=NOW)
        revisions.append(stop.revision)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(issue, i)
    assert sorted(revisions) == list(range(1, 51))
    assert [c.revision for c in await registry.changes_since(0)] == list(range(1, 51))
    assert len(await registry.active_stops(now=NOW)) == 50


_WRITER = """
import sys, time, anyio
from haltwire.store.registry.sqlite import SqliteRegistry

async def main() -> None:
    registry = await SqliteRegistry.open(sys.argv[1])
    stop = await registry.issue_stop("global", "durable", "alice", now=1.0)
    print(stop.stop_id, flush=True)
    time.sleep(60)

anyio.run(main)
"""


def kill_9_after_write(path: Path) -> str:
    """Run a writer process, SIGKILL it as soon as its write returned; answers the stop id it printed."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        stop_id = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    return stop_id


async def test_sqlite_write_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    stop_id = await anyio.to_thread.run_sync(kill_9_after_write, path)
    assert stop_id.startswith("stp_")
    registry = await SqliteRegistry.open(path)
    try:
        stop = await registry.get_stop(stop_id)
        assert stop is not None and stop.reason == "durable"
        assert await registry.revision() == 1
    finally:
        await registry.aclose()


async def test_postgres_down_is_unavailable() -> None:
    with pytest.raises(RegistryUnavailable):
        await PostgresRegistry.open(
            "postgresql://postgres@127.0.0.1:1/test", schema="never", connect_timeout=2
        )


async def test_sqlite_unopenable_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RegistryUnavailable):
        await SqliteRegistry.open(tmp_path / "no" / "such" / "dir" / "registry.db")


async def test_postgres_reconnects_after_losing_its_connection() -> None:
    schema = f"test_registry_{uuid.uuid4().hex[:12]}"
    try:
        registry = await PostgresRegistry.open(postgres_url(), schema=schema, application_name=schema)
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        stop = await registry.issue_stop("global", "before", "alice", now=NOW)
        with psycopg.connect(postgres_url(), autocommit=True, connect_timeout=5) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (schema,),
            ).fetchone()
        assert killed == (1,)
        # The lost connection may be reported once (never as a wrong answer); then it reconnects.
        with contextlib.suppress(RegistryUnavailable):
            await registry.get_stop(stop.stop_id)
        assert await registry.get_stop(stop.stop_id) == stop
    finally:
        await registry.aclose()
        drop_schema(schema)
