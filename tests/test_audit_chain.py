"""The audit log cannot be shortened or rewritten unnoticed (issue 11, point 4).

Tampering is done the way someone with database access but not the audit key would: raw SQL
on the control plane's own database (SQLite and PostgreSQL), a chain recomputed with plain
SHA-256 or another key, registry rows edited, inserted or deleted, the newest records removed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
from psycopg import sql

from cli_process import run_haltwire
from control_harness import Events, auth, cli, control, issue, raw_sql
from haltwire.config import ConfigError
from haltwire.control import parse_control_config
from haltwire.control.stores import audit_key
from haltwire.store.audit import COLUMNS, AuditRecord, from_row, hash_of
from haltwire.store.audit.sqlite import SqliteAuditLog

pytestmark = pytest.mark.anyio


async def verify(client: httpx2.AsyncClient, expect: str | None = None) -> dict[str, Any]:
    query = "" if expect is None else f"?expect_head={expect}"
    r = await client.get(f"/v1/audit/verify{query}", headers=auth("viewer"))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def head(client: httpx2.AsyncClient) -> str:
    r = await client.get("/v1/audit/head", headers=auth("viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["head"] == f"{body['seq']}:{body['hash']}"
    return str(body["head"])


def rows(store: dict[str, Any]) -> list[AuditRecord]:
    """The audit log as stored, read outside the control plane."""
    query = f"SELECT {', '.join(COLUMNS)} FROM audit ORDER BY seq"
    if store["backend"] == "sqlite":
        lite = sqlite3.connect(store["path"])
        try:
            found = lite.execute(query).fetchall()
        finally:
            lite.close()
    else:
        with psycopg.connect(store["url"]) as pg:
            pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store["schema"])))
            found = pg.execute(query.encode()).fetchall()
    return [from_row(row) for row in found]


def rewrite_from(store: dict[str, Any], records: list[AuditRecord], seq: int, key: bytes | None) -> list[str]:
    """The statements that rewrite every record from ``seq`` on with a chain recomputed with
    ``key`` (None: plain SHA-256), as an attacker who edited record ``seq`` would."""
    statements, prev = [], next((r.hash for r in records if r.seq == seq - 1), "0" * 64)
    for record in records:
        if record.seq < seq:
            continue
        fixed = replace(record, prev_hash=prev, hash="")
        fixed = replace(fixed, hash=hash_of(fixed, key))
        reason = fixed.reason.replace("'", "''")
        statements.append(
            f"UPDATE audit SET reason = '{reason}', prev_hash = '{fixed.prev_hash}', hash = '{fixed.hash}' "
            f"WHERE seq = {record.seq}"
        )
        prev = fixed.hash
    return statements


async def test_the_newest_records_removed_are_found_against_a_held_head(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, registry=store) as (client, _):
        for scope in ("agent:a1", "tenant:t1", "tool:refund"):
            await issue(client, scope)
        held = await head(client)
        assert held.startswith("3:")
        assert (await verify(client, held))["ok"] is True

        # The last stop and its record removed together: the registry agrees with the log.
        raw("DELETE FROM audit WHERE seq = 3", "DELETE FROM changes WHERE revision = 3")
        alone = await verify(client)
        assert alone["ok"] is True and alone["checked"] == 2  # what the log alone cannot tell
        shortened = await verify(client, held)
        assert (shortened["ok"], shortened["first_bad_seq"]) == (False, 3), shortened
        assert "shortened" in shortened["problem"]

        # Every record and every change removed.
        raw("DELETE FROM audit", "DELETE FROM changes")
        emptied = await verify(client, held)
        assert emptied["ok"] is False and "shortened" in emptied["problem"], emptied


@pytest.mark.parametrize("attacker_key", [None, b"a-guess-at-the-key-" + b"x" * 32])
async def test_an_edited_record_with_its_chain_recomputed_is_found(
    tmp_path: Path, store: dict[str, Any], attacker_key: bytes | None
) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, registry=store) as (client, _):
        for scope in ("agent:a1", "tenant:t1", "tool:refund"):
            await issue(client, scope)
        records = rows(store)
        records[1] = replace(records[1], reason="nothing happened here")
        raw(*rewrite_from(store, records, 2, attacker_key))
        result = await verify(client)
        assert (result["ok"], result["first_bad_seq"]) == (False, 2), result
        assert "hash mismatch" in result["problem"]


async def test_registry_rows_are_inside_the_chain(tmp_path: Path, store: dict[str, Any]) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, registry=store) as (client, _):
        first = await issue(client, "agent:a1")
        await issue(client, "tenant:t1")
        r = await client.post(f"/v1/stops/{first['stop_id']}/clear", json={"reason": "ok"}, headers=auth("operator"))
        assert r.status_code == 200
        assert (await verify(client))["ok"] is True

        # A stop's scope edited, so that it stops something else than the record says.
        raw("UPDATE changes SET scope = 'tool:nothing' WHERE revision = 2")
        edited = await verify(client)
        assert edited["ok"] is False and "registry change 2 differs" in edited["problem"], edited
        assert edited["first_bad_seq"] == 2
        raw("UPDATE changes SET scope = 'tenant:t1' WHERE revision = 2")
        assert (await verify(client))["ok"] is True

        # A clear deleted, so that a cleared stop is in force again.
        raw("DELETE FROM changes WHERE revision = 3")
        gone = await verify(client)
        assert gone["ok"] is False and "registry change 3" in gone["problem"] and "gone" in gone["problem"], gone

    # A stop written straight into the registry, around the control plane and its audit.
    other = {**store, "path": str(tmp_path / "other.db")} if store["backend"] == "sqlite" else store
    async with control(tmp_path / "other", registry=other) as (client, _):
        if store["backend"] == "postgres":
            raw_sql(other)("DELETE FROM audit", "DELETE FROM changes")
        await issue(client, "agent:a1")
        first = (await verify(client))["checked"]
        raw_sql(other)(
            "INSERT INTO changes (revision, kind, stop_id, scope, reason, actor, at, expires_at) "
            "SELECT MAX(revision) + 1, 'stop', 'stp_forged', 'global', 'r', 'mallory', 1, NULL FROM changes"
        )
        forged = await verify(client)
        assert forged["ok"] is False and forged["checked"] == first, forged
        assert "no audit record" in forged["problem"] and "written around the control plane" in forged["problem"]


async def test_a_malformed_record_is_reported_as_tampered_not_a_500(tmp_path: Path) -> None:
    from runs_harness import plane

    store = {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    async with plane(store) as (client, _):
        r = await client.post("/v1/runs", json={"run_id": "r-1"}, headers=auth("agent"))
        assert r.status_code == 201, r.text
        await issue(client, "tool:refund")
        raw_sql(store)("UPDATE audit SET at = 'yesterday' WHERE seq = 1")

        listed = await client.get("/v1/audit", headers=auth("viewer"))
        assert listed.status_code == 200, listed.text
        first = listed.json()["records"][0]
        assert first["seq"] == 1 and "at is not a time" in first["malformed"]
        result = await verify(client)
        assert (result["ok"], result["first_bad_seq"]) == (False, 1), result
        assert "malformed" in result["problem"]
        report = await client.get("/v1/runs/r-1/report", headers=auth("operator"))
        assert report.status_code == 200, report.text
        assert "at is not a time" in report.json()["timeline"][0]["malformed"]


async def test_the_watch_publishes_the_audit_head_as_it_moves(tmp_path: Path) -> None:
    async with control(tmp_path, heartbeat_s=0.2) as (client, _):
        async with client.stream("GET", "/v1/watch", headers=auth("gateway")) as watch:
            events = Events(watch, heads=False)
            assert await events.next() == {"comment": "caught-up"}
            empty = await events.next()
            assert empty["event"] == "audit-head" and json.loads(empty["data"])["seq"] == 0
            await issue(client, "agent:a1")
            published = None
            while published is None:
                event = await events.next()
                if event.get("event") == "audit-head":
                    published = json.loads(event["data"])
            assert f"{published['seq']}:{published['hash']}" == await head(client)
            assert published["seq"] == 1


async def test_a_log_from_before_keys_is_sealed_and_its_prefix_still_checked(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    legacy = await SqliteAuditLog.open(path)
    for i in range(3):
        await legacy.append("operator-1", "operator", "stop.issue", f"tool:t{i}", "ok", f"r{i}", {}, now=1e9 + i)
    await legacy.aclose()
    store = {"backend": "sqlite", "path": str(path)}
    async with control(tmp_path, registry=store) as (client, _):
        result = await verify(client)
        assert (result["ok"], result["sealed"], result["checked"]) == (True, 3, 4), result
        seal = (await client.get("/v1/audit", headers=auth("viewer"))).json()["records"][3]
        assert (seal["action"], seal["detail"]["sealed_seq"]) == ("audit.seal", 3)
        await issue(client, "agent:a1")
        assert (await verify(client))["ok"] is True

        raw_sql(store)("UPDATE audit SET reason = 'edited' WHERE seq = 2")
        edited = await verify(client)
        assert (edited["ok"], edited["first_bad_seq"]) == (False, 2), edited
    async with control(tmp_path, registry=store) as (client, _):
        # A restart does not seal again over a keyed log.
        assert [r["action"] for r in (await client.get("/v1/audit", headers=auth("viewer"))).json()["records"]].count(
            "audit.seal"
        ) == 1


async def test_cli_audit_head_and_verify_expect_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    async with control(tmp_path, registry=store) as (client, _):
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", str(client.base_url).rstrip("/"))
        monkeypatch.setenv("HALTWIRE_TOKEN", "tok-viewer")
        await issue(client, "agent:a1")
        await issue(client, "tool:refund")
        assert await cli("audit", "head") == 0
        held = capsys.readouterr().out.strip()
        assert held == await head(client)
        assert await cli("audit", "verify", "--expect-head", held) == 0
        assert "intact" in capsys.readouterr().out
        raw_sql(store)("DELETE FROM audit WHERE seq = 2", "DELETE FROM changes WHERE revision = 2")
        assert await cli("audit", "verify", "--expect-head", held) == 1
        assert "TAMPERED at seq 2" in capsys.readouterr().err
        assert await cli("audit", "verify", "--expect-head", "2:not-a-hash") == 2
        assert "SEQ:HASH" in capsys.readouterr().err
        for bad in ("2:not-a-hash", f"{2**63}:{'0' * 64}", f"{'9' * 30}:{'0' * 64}"):
            r = await client.get("/v1/audit/verify", params={"expect_head": bad}, headers=auth("viewer"))
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (bad, r.text)


def test_the_key_is_kept_out_of_the_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite = parse_control_config({"registry": {"path": str(tmp_path / "c.db")}})
    key = audit_key(sqlite)
    key_file = tmp_path / "c.db.audit-key"
    assert key_file.read_text().strip().encode() == key and len(key) == 64
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert audit_key(sqlite) == key  # made once, then read

    with pytest.raises(ConfigError, match="with PostgreSQL, give key_env"):
        parse_control_config({"registry": {"backend": "postgres"}})
    with pytest.raises(ConfigError, match=r"only with control\.development"):
        parse_control_config({"audit": {"key": "k" * 40}})
    from_env = parse_control_config({"registry": {"backend": "postgres"}, "audit": {"key_env": "HW_AUDIT_KEY"}})
    monkeypatch.delenv("HW_AUDIT_KEY", raising=False)
    with pytest.raises(ConfigError, match="HW_AUDIT_KEY is not set"):
        audit_key(from_env)
    monkeypatch.setenv("HW_AUDIT_KEY", "short")
    with pytest.raises(ConfigError, match="shorter than 32"):
        audit_key(from_env)
    monkeypatch.setenv("HW_AUDIT_KEY", "s" * 32)
    assert audit_key(from_env) == b"s" * 32


def test_the_control_plane_will_not_start_without_its_audit_key(tmp_path: Path) -> None:
    config = tmp_path / "control.toml"
    config.write_text('[control]\nport = 0\n\n[audit]\nkey_env = "HW_UNSET_AUDIT_KEY"\n')
    env = {k: v for k, v in os.environ.items() if k != "HW_UNSET_AUDIT_KEY"}
    done = run_haltwire("control", "--config", str(config), env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "haltwire control: audit.key_env: the environment variable HW_UNSET_AUDIT_KEY is not set"
    )
    assert not (tmp_path / "haltwire.db").exists()  # refused before anything was opened
