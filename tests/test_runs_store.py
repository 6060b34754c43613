"""The ``RunStore`` contract, for SQLite (a temporary file) and PostgreSQL (a real server).

Every test runs against both backends. PostgreSQL uses a unique schema, dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from haltwire.scope import Scope
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.registry.sqlite import SqliteRegistry
from haltwire.store.runs import RunExists, RunRecord, RunStore, UnknownRun, new_run_id
from haltwire.store.runs.postgres import PostgresRunStore
from haltwire.store.runs.sqlite import SqliteRunStore
from harness import drop_schema, postgres_url, service_missing

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
async def runs(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunStore]:
    if request.param == "sqlite":
        store: RunStore = await SqliteRunStore.open(tmp_path / "control.db")
        yield store
        await store.aclose()
        return
    schema = f"test_runs_{uuid.uuid4().hex[:12]}"
    try:
        store = await PostgresRunStore.open(postgres_url(), schema=schema)
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        yield store
    finally:
        await store.aclose()
        drop_schema(schema)


def run(run_id: str, at: float = NOW, **fields: object) -> RunRecord:
    base: dict[str, object] = {
        "run_id": run_id,
        "agent": "a1",
        "tenant": "acme",
        "version": "2.1",
        "tools": ("lookup_order", "refund"),
        "agent_class": "default",
        "registered_by": "agent-1",
        "registered_at": at,
    }
    return RunRecord(**{**base, **fields})  # type: ignore[arg-type]


async def test_register_and_get_round_trips_every_field(runs: RunStore) -> None:
    record = run("r1", resumed_from="r0")
    assert await runs.register(record) == record
    assert await runs.get("r1") == record
    assert await runs.get("nope") is None
    assert record.scopes == {
        Scope("run", "r1"),
        Scope("agent", "a1"),
        Scope("tenant", "acme"),
        Scope("version", "a1@2.1"),
        Scope("global"),
    }


async def test_a_run_id_is_registered_once(runs: RunStore) -> None:
    await runs.register(run("r1"))
    with pytest.raises(RunExists):
        await runs.register(run("r1", agent="a2"))
    got = await runs.get("r1")
    assert got is not None and got.agent == "a1"


async def test_list_is_newest_first_and_limited(runs: RunStore) -> None:
    for i in range(5):
        await runs.register(run(f"r{i}", at=NOW + i))
    assert [r.run_id for r in await runs.list(3)] == ["r4", "r3", "r2"]
    assert len(await runs.list(100)) == 5


async def test_end_sets_ended_at_once(runs: RunStore) -> None:
    await runs.register(run("r1"))
    first = await runs.end("r1", NOW + 5)
    assert first.ended and first.ended_at == NOW + 5
    again = await runs.end("r1", NOW + 9)
    assert again.ended_at == NOW + 5  # the first end wins
    assert await runs.get("r1") == first
    with pytest.raises(UnknownRun):
        await runs.end("nope", NOW)


async def test_checkpoints_are_numbered_per_run_and_the_latest_wins(runs: RunStore) -> None:
    await runs.register(run("r1"))
    await runs.register(run("r2"))
    assert await runs.latest_checkpoint("r1") is None
    one = await runs.save_checkpoint("r1", {"step": 1, "notes": ["a", {"b": None}]}, NOW + 1)
    two = await runs.save_checkpoint("r1", {"step": 2}, NOW + 2)
    other = await runs.save_checkpoint("r2", {"step": 7}, NOW + 3)
    assert (one.seq, two.seq, other.seq) == (1, 2, 1)
    assert one.data == {"step": 1, "notes": ["a", {"b": None}]}
    assert await runs.latest_checkpoint("r1") == two
    assert await runs.latest_checkpoint("r2") == other
    with pytest.raises(UnknownRun):
        await runs.save_checkpoint("nope", {}, NOW)


async def test_concurrent_checkpoints_get_distinct_consecutive_seqs(runs: RunStore) -> None:
    await runs.register(run("r1"))
    seqs: list[int] = []

    async def save(i: int) -> None:
        seqs.append((await runs.save_checkpoint("r1", {"i": i}, NOW + i)).seq)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(save, i)
    assert sorted(seqs) == list(range(1, 11))
    latest = await runs.latest_checkpoint("r1")
    assert latest is not None and latest.seq == 10


async def test_generated_run_ids_are_distinct_and_valid() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("run_") and len(i) == 20 for i in ids)


async def test_runs_share_the_registry_file(tmp_path: Path) -> None:
    db = tmp_path / "control.db"
    registry = await SqliteRegistry.open(db)
    runs = await SqliteRunStore.open(db)
    try:
        await registry.issue_stop("run:r1", "runaway", "op", now=NOW)
        await runs.register(run("r1"))
        assert (await runs.get("r1")) is not None and await registry.revision() == 1
    finally:
        await runs.aclose()
        await registry.aclose()


async def test_a_closed_store_and_an_unreachable_server_are_unavailable(tmp_path: Path) -> None:
    runs = await SqliteRunStore.open(tmp_path / "control.db")
    await runs.aclose()
    with pytest.raises(RegistryUnavailable):
        await runs.get("r1")
    with pytest.raises(RegistryUnavailable):
        await PostgresRunStore.open("postgresql://postgres@127.0.0.1:1/test", connect_timeout=1)


async def test_the_latest_lease_grant_of_each_run_is_kept_and_an_older_one_changes_nothing(runs: RunStore) -> None:
    # More runs than one statement writes: every batch lands.
    await runs.note_grants({f"run-{i}": (NOW + i, NOW + i + 15) for i in range(250)})
    await runs.note_grants({"run-1": (NOW + 100, NOW + 115), "run-2": (NOW - 50, NOW - 35)})
    got = await runs.grants(["run-1", "run-2", "run-249", "run-none"])
    assert got == {"run-1": (NOW + 100, NOW + 115), "run-2": (NOW + 2, NOW + 17), "run-249": (NOW + 249, NOW + 264)}
    assert await runs.grants([]) == {}
