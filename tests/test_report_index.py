"""Run reports read what concerns the run only, on SQLite and PostgreSQL.

A report reads the stops on the run's scopes in its lifetime (and those that cancelled its
intents) and the audit records its index names, so a registry full of other runs' stops and
records costs a report nothing: the rows it reads (``counting_rows``) are the same with 30 other
runs beside it as without, and fewer than the audit log holds. A database made before the index
(its index tables dropped, as an earlier version left it) is indexed when the control plane
opens it, and its reports are the same as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest

from haltwire.control import create_app, parse_control_config
from haltwire.control.access import authenticate
from haltwire.control.plane import Plane
from haltwire.control.reports import report
from haltwire.control.stores import open_stores
from haltwire.serve import serving
from haltwire.store.sql import counting_rows
from intents_harness import EXECUTOR_2, auth, issue, propose
from runs_harness import config_dict as runs_config

pytestmark = pytest.mark.anyio

OTHER_RUNS = 30


@asynccontextmanager
async def plane(registry: dict[str, Any]) -> AsyncIterator[tuple[httpx2.AsyncClient, Plane]]:
    data = runs_config(registry)
    data["identities"].append(EXECUTOR_2)
    config = parse_control_config(data)
    async with open_stores(config) as stores:
        app = create_app(config, stores)
        async with serving(app) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
                yield client, app.state.plane


async def register(client: httpx2.AsyncClient, run_id: str) -> None:
    r = await client.post("/v1/runs", json={"run_id": run_id}, headers=auth("agent"))
    assert r.status_code == 201, r.text


async def clear(client: httpx2.AsyncClient, stop_id: str) -> None:
    r = await client.post(f"/v1/stops/{stop_id}/clear", json={"reason": "reviewed"}, headers=auth("operator"))
    assert r.status_code == 200, r.text


async def run_with_stops(client: httpx2.AsyncClient, run_id: str, key: str) -> None:
    """A run with an intent its own stop cancelled, the stop cleared."""
    await register(client, run_id)
    await propose(client, key, run_id=run_id)
    await clear(client, (await issue(client, f"run:{run_id}", "loop"))["stop_id"])


async def read(plane_: Plane, run_id: str) -> tuple[dict[str, Any], int]:
    """The run's report, as the API derives it, and the rows it read."""
    caller = authenticate(plane_, "Bearer tok-operator")
    with counting_rows() as counted:
        out = await report(plane_, caller, run_id)
    return dataclasses.asdict(out), counted.rows


async def test_a_report_reads_none_of_the_other_runs_records(store: dict[str, Any]) -> None:
    async with plane(store) as (client, cp):
        await run_with_stops(client, "r-1", "k-1")
        tool_stop = await issue(client, "tool:refund", "refunds paused")  # cancels nothing new
        await clear(client, tool_stop["stop_id"])
        agent_stop = await issue(client, "agent:a1", "the whole agent")
        await clear(client, agent_stop["stop_id"])
        alone, rows_alone = await read(cp, "r-1")
        assert [s["scope"] for s in alone["stops"]] == ["run:r-1", "agent:a1"]
        assert len(alone["cancelled"]) == 1 and alone["timeline"]

        for n in range(2, OTHER_RUNS + 2):
            await run_with_stops(client, f"r-{n}", f"k-{n}")
        crowded, rows_crowded = await read(cp, "r-1")
        with counting_rows() as whole:
            records = await cp.open.audit.records()

    assert crowded == alone  # the same report, every section and the timeline
    assert rows_crowded == rows_alone  # not one row of the other runs' read
    assert 0 < rows_crowded < len(records) // 4
    assert whole.rows == len(records)  # the counter counts what a read answers


async def test_a_database_made_before_the_index_reports_the_same(store: dict[str, Any]) -> None:
    async with plane(store) as (client, cp):
        await run_with_stops(client, "r-1", "k-1")
        await run_with_stops(client, "r-2", "k-2")
        before, _ = await read(cp, "r-1")
        # As an earlier version left the database: no index of subjects, no scope index.
        async with cp.open.db.write() as tx:
            await tx.execute("DROP TABLE {audit_subjects}")
            await tx.execute("DROP TABLE {audit_indexed}")
            schema = f"{store['schema']}." if store["backend"] == "postgres" else ""
            await tx.execute(f"DROP INDEX {schema}changes_by_scope")
    async with plane(store) as (client, cp):  # opened by this version: indexed, then served
        after, _ = await read(cp, "r-1")
        assert after == before
        assert await cp.open.db.all("SELECT legacy_upto FROM {audit_indexed}") == [(0,)]
        indexed = await cp.open.db.all("SELECT subject FROM {audit_subjects} WHERE subject = ?", ("r-1",))
        assert indexed  # the intent records name the run in their detail
        # Records written now are indexed as they are written.
        await run_with_stops(client, "r-3", "k-3")
        third, _ = await read(cp, "r-3")
        assert [s["scope"] for s in third["stops"]] == ["run:r-3"] and third["cancelled"]
        assert {e["action"] for e in third["timeline"]} >= {"run.register", "intent.create", "stop.issue"}


async def test_records_of_an_unindexed_prefix_are_found_before_the_backfill(store: dict[str, Any]) -> None:
    async with plane(store) as (client, cp):
        await run_with_stops(client, "r-1", "k-1")
        before, _ = await read(cp, "r-1")
        async with cp.open.db.write() as tx:  # the backfill not yet run: the prefix is scanned
            await tx.execute("DELETE FROM {audit_subjects}")
            await tx.execute("UPDATE {audit_indexed} SET legacy_upto = (SELECT MAX(seq) FROM {audit})")
        during, _ = await read(cp, "r-1")
        assert during == before
        assert await cp.open.audit.backfill() > 0
        assert await cp.open.audit.backfill() == 0  # once
        after, _ = await read(cp, "r-1")
        assert after == before
