"""Every SQLite file haltwire creates is its owner's alone (0600), whatever the umask: the
control plane's database (stops, audit log, runs, credentials, intents), the gateway's
idempotency records, the demo shop's ledger, and their ``-wal`` and ``-shm`` files. An existing
file readable by others is tightened to 0600 when it is opened (issue 12, point 7: they were
created 0644 under the usual umask of 022).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from haltwire.control import parse_control_config
from haltwire.control.stores import open_stores
from haltwire.demo.shop import Ledger
from haltwire.store.idempotency.sqlite import SqliteIdempotency
from haltwire.store.registry.sqlite import SqliteRegistry
from plane_harness import plane_config

pytestmark = pytest.mark.anyio

SIDECARS = ("", "-wal", "-shm")


@pytest.fixture(params=[0o022, 0o002, 0o000], ids=["umask-022", "umask-002", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    mask: int = request.param
    old = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(old)


def modes(db: Path) -> dict[str, int]:
    """The permission bits of the database and each sidecar that exists."""
    out = {}
    for suffix in SIDECARS:
        path = Path(f"{db}{suffix}")
        if path.exists():
            out[path.name] = stat.S_IMODE(path.stat().st_mode)
    return out


def private(db: Path) -> None:
    found = modes(db)
    assert set(found) == {f"{db.name}{s}" for s in SIDECARS}, found  # WAL: all three exist
    assert found == {name: 0o600 for name in found}, {n: oct(m) for n, m in found.items()}


async def test_the_control_planes_database_is_created_private(tmp_path: Path, umask: int) -> None:
    db = tmp_path / "control.db"
    config = parse_control_config(plane_config({"backend": "sqlite", "path": str(db)}))
    async with open_stores(config) as stores:
        await stores.registry.issue_stop("run:r-1", "runaway", "op", now=time.time())
        private(db)
    assert modes(db)[db.name] == 0o600
    assert modes(Path(f"{db}.audit-key")) == {"control.db.audit-key": 0o600}


async def test_the_idempotency_records_are_created_private(tmp_path: Path, umask: int) -> None:
    db = tmp_path / "records.db"
    store = SqliteIdempotency(db)
    try:
        await store.connect()
        await store.begin("k", "f", time.time(), 60)
        private(db)
    finally:
        await store.aclose()


def test_the_demo_shops_ledger_is_created_private(tmp_path: Path, umask: int) -> None:
    db = tmp_path / "ledger.db"
    Ledger(db)
    found = modes(db)
    assert found and found == {name: 0o600 for name in found}, {n: oct(m) for n, m in found.items()}


async def test_an_existing_database_open_to_others_is_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Decided: a file written by an earlier version (0644) is made 0600 as it is opened, its
    sidecars too, with a warning naming it; its owner's own bits are left as they are."""
    db = tmp_path / "control.db"
    registry = await SqliteRegistry.open(db)
    await registry.issue_stop("run:r-1", "runaway", "op", now=time.time())
    for suffix in SIDECARS:
        os.chmod(f"{db}{suffix}", 0o644)
    with caplog.at_level(logging.WARNING):
        again = await SqliteRegistry.open(db)
    try:
        private(db)
        assert len(await again.all_stops()) == 1
    finally:
        await again.aclose()
        await registry.aclose()
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith(str(db))]
    assert len(warned) == 3 and "was mode 0644" in warned[0] and "made 0600" in warned[0], caplog.text


async def test_a_private_database_is_left_as_it_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "control.db"
    registry = await SqliteRegistry.open(db)
    await registry.aclose()
    os.chmod(db, 0o600)
    with caplog.at_level(logging.WARNING):
        registry = await SqliteRegistry.open(db)
    await registry.aclose()
    assert modes(db)[db.name] == 0o600 and not caplog.records
