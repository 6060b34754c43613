"""The control plane's API against a real server on loopback: roles, audit, watch, failures."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from control_harness import ROLES, TOKEN, Events, auth, cli, control, issue
from haltwire.store.registry.postgres import DEFAULT_URL, notify_channel
from harness import postgres_section

pytestmark = pytest.mark.anyio

# -- role matrix -----------------------------------------------------------------------------

ALLOWED: dict[str, set[str | None]] = {
    "issue": {"operator", "tripwire"},
    "clear": {"operator"},
    "stops": set(ROLES),
    "audit": {"operator", "viewer"},
    "verify": {"operator", "viewer"},
    "watch": {"operator", "gateway", "executor", "viewer", "agent"},
    "healthz": {*ROLES, None},
    "whoami": set(ROLES),
}


async def call(client: httpx2.AsyncClient, endpoint: str, role: str | None) -> int:
    headers = auth(role) if role else {}
    if endpoint == "issue":
        r = await client.post("/v1/stops", json={"scope": "tool:x", "reason": "r"}, headers=headers)
    elif endpoint == "clear":
        stop = await issue(client, "tool:y")
        r = await client.post(f"/v1/stops/{stop['stop_id']}/clear", json={"reason": "ok"}, headers=headers)
    elif endpoint == "watch":
        async with client.stream("GET", "/v1/watch", headers=headers) as resp:
            return resp.status_code
    else:
        path = {
            "stops": "/v1/stops",
            "audit": "/v1/audit",
            "verify": "/v1/audit/verify",
            "healthz": "/healthz",
            "whoami": "/v1/whoami",
        }
        r = await client.get(path[endpoint], headers=headers)
    return r.status_code


async def test_every_endpoint_against_every_role_and_no_token(tmp_path: Path, store: dict[str, Any]) -> None:
    ok = {"issue": 201}
    async with control(tmp_path, registry=store) as (client, _):
        got, want = {}, {}
        for endpoint, allowed in ALLOWED.items():
            for role in (*ROLES, None):
                status = await call(client, endpoint, role)
                got[endpoint, role] = status
                want[endpoint, role] = (
                    ok.get(endpoint, 200) if role in allowed else (401 if role is None else 403)
                )
        assert got == want


async def test_malformed_and_unknown_tokens_get_401_in_the_refusal_shape(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        for header in ("Bearer nope", "Basic dG9rOng=", "Bearer", "tok-operator"):
            r = await client.get("/v1/stops", headers={"Authorization": header})
            assert r.status_code == 401
            error = r.json()["error"]
            assert error["code"] == "unauthenticated" and error["retryable"] is False
            assert "stop calling tools" not in error["message"], "an operator is not a model"


async def test_an_expired_token_gets_401_and_one_before_its_expiry_is_served(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    identities = [
        {"name": "old-op", "role": "operator", "token": "tok-old", "expires": now - timedelta(seconds=1)},
        {"name": "new-op", "role": "operator", "token": "tok-new", "expires": now + timedelta(hours=1)},
    ]
    async with control(tmp_path, identities=identities) as (client, _):
        r = await client.get("/v1/stops", headers={"Authorization": "Bearer tok-old"})
        assert r.status_code == 401 and "token expired" in r.json()["error"]["message"]
        r = await client.get("/v1/stops", headers={"Authorization": "Bearer tok-new"})
        assert r.status_code == 200


def test_a_token_expiry_without_a_utc_offset_is_a_config_error(tmp_path: Path) -> None:
    from haltwire.config import ConfigError
    from haltwire.control import load_control_config

    path = tmp_path / "control.toml"
    path.write_text(
        '[[identities]]\nname = "o"\nrole = "operator"\ntoken_sha256 = "' + "0" * 64 + '"\n'
        "expires = 2027-01-31T00:00:00\n"
    )
    with pytest.raises(ConfigError, match="UTC offset"):
        load_control_config(path)


# -- stops, clears and their audit records ------------------------------------------------------


async def test_stop_and_clear_round_trip_is_audited(tmp_path: Path, store: dict[str, Any]) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        stop = await issue(client, "run:r1")
        assert stop["issued_by"] == "operator-1" and stop["stop_id"].startswith("stp_")
        active = (await client.get("/v1/stops", headers=auth("viewer"))).json()["stops"]
        assert [s["stop_id"] for s in active] == [stop["stop_id"]]

        path = f"/v1/stops/{stop['stop_id']}/clear"
        r = await client.post(path, json={"reason": "fixed"}, headers=auth("operator"))
        assert r.status_code == 200 and r.json()["cleared_by"] == "operator-1"
        assert (await client.get("/v1/stops", headers=auth("viewer"))).json()["stops"] == []
        every = (await client.get("/v1/stops?all=1", headers=auth("viewer"))).json()["stops"]
        assert [s["cleared"] for s in every] == [True]

        again = await client.post(path, json={"reason": "fixed"}, headers=auth("operator"))
        assert again.status_code == 409
        unknown = await client.post(
            "/v1/stops/stp_nope/clear", json={"reason": "x"}, headers=auth("operator")
        )
        assert unknown.status_code == 404

        records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        assert [(r["actor"], r["action"], r["outcome"]) for r in records[:2]] == [
            ("operator-1", "stop.issue", "ok"),
            ("operator-1", "stop.clear", "ok"),
        ]
        assert records[0]["target"] == "run:r1" and records[1]["reason"] == "fixed"
        by_target = (await client.get("/v1/audit?target=run:r1", headers=auth("viewer"))).json()
        assert [r["action"] for r in by_target["records"]] == ["stop.issue"]
        verified = (await client.get("/v1/audit/verify", headers=auth("viewer"))).json()
        assert verified["ok"] is True and verified["checked"] == len(records)


async def test_bad_scope_and_empty_reason_are_422_with_a_clear_message(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        r = await client.post(
            "/v1/stops", json={"scope": "planet:x", "reason": "r"}, headers=auth("operator")
        )
        assert r.status_code == 422 and "is not a scope" in r.json()["error"]["message"]
        r = await client.post("/v1/stops", json={"scope": "global", "reason": ""}, headers=auth("operator"))
        assert r.status_code == 422 and "reason" in r.json()["error"]["message"]
        r = await client.post("/v1/stops", content=b"not json", headers=auth("operator"))
        assert r.status_code == 422


async def test_an_agent_clearing_its_own_stop_gets_403_and_an_audit_record(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        stop = await issue(client, "agent:a1", role="tripwire")
        r = await client.post(
            f"/v1/stops/{stop['stop_id']}/clear", json={"reason": "let me go"}, headers=auth("agent")
        )
        assert r.status_code == 403
        assert "needs role operator" in r.json()["error"]["message"]
        records = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
        last = records[-1]
        assert (last["actor"], last["role"], last["action"], last["outcome"]) == (
            "agent-1",
            "agent",
            "stop.clear",
            "refused",
        )
        assert last["target"] == stop["stop_id"]
        still = (await client.get("/v1/stops", headers=auth("operator"))).json()["stops"]
        assert [s["stop_id"] for s in still] == [stop["stop_id"]]


async def test_an_agent_sees_only_its_own_and_global_stops(tmp_path: Path, store: dict[str, Any]) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        mine = await issue(client, "agent:a1")
        await issue(client, "agent:a2")
        await issue(client, "tenant:t1")
        everyone = await issue(client, "global")
        seen = (await client.get("/v1/stops", headers=auth("agent"))).json()["stops"]
        assert {s["stop_id"] for s in seen} == {mine["stop_id"], everyone["stop_id"]}
        async with client.stream("GET", "/v1/watch?since=0", headers=auth("agent")) as resp:
            events = Events(resp)
            got = [json.loads((await events.next_change())["data"])["stop"]["stop_id"] for _ in range(2)]
        assert got == [mine["stop_id"], everyone["stop_id"]]


# -- the watch stream --------------------------------------------------------------------------


async def test_watch_replays_pushes_and_resumes_without_gaps_or_repeats(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    async with control(tmp_path, heartbeat_s=0.2, registry=store) as (client, _):
        first = await issue(client, "tool:a")
        await client.post(
            f"/v1/stops/{first['stop_id']}/clear", json={"reason": "ok"}, headers=auth("operator")
        )
        async with client.stream("GET", "/v1/watch?since=0", headers=auth("gateway")) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = Events(resp)
            got = [await events.next() for _ in range(2)]
            assert [(e["id"], e["event"]) for e in got] == [("1", "stop"), ("2", "clear")]
            # The replay is complete: the comment that lets a watcher count itself current.
            assert (await events.next(within=2)) == {"comment": "caught-up"}
            pushed = await issue(client, "tool:b")
            event = await events.next_change()
            assert (event["id"], event["event"]) == ("3", "stop")
            assert json.loads(event["data"])["stop"]["stop_id"] == pushed["stop_id"]
            assert (await events.next(within=2)) == {"comment": "heartbeat"}

        missed = [await issue(client, f"tool:m{i}") for i in range(2)]
        headers = {**auth("gateway"), "Last-Event-ID": "3"}
        async with client.stream("GET", "/v1/watch?since=0", headers=headers) as resp:
            events = Events(resp)
            got = [await events.next_change() for _ in range(2)]
            assert [e["id"] for e in got] == ["4", "5"]
            assert [json.loads(e["data"])["stop"]["stop_id"] for e in got] == [m["stop_id"] for m in missed]
            assert (await events.next(within=2)) == {"comment": "caught-up"}
            assert (await events.next(within=2)) == {"comment": "heartbeat"}  # nothing repeated


async def test_a_stop_written_through_one_replica_reaches_watchers_of_another(tmp_path: Path) -> None:
    # A 30 s heartbeat: only LISTEN/NOTIFY can bring the change across in time.
    with postgres_section() as section:
        async with control(tmp_path, 30.0, section) as (a, _), control(tmp_path, 30.0, section) as (b, _):
            async with b.stream("GET", "/v1/watch?since=0", headers=auth("gateway")) as resp:
                events = Events(resp)
                first = await issue(a, "tenant:t1")
                event = await events.next_change(within=3)
                assert json.loads(event["data"])["stop"]["stop_id"] == first["stop_id"]

                # Replica B's listener loses its connection; a write during the gap still arrives.
                channel = notify_channel(section["schema"])
                with psycopg.connect(DEFAULT_URL, autocommit=True) as conn:
                    killed = conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE query LIKE %s AND pid <> pg_backend_pid()",
                        (f"LISTEN%{channel}%",),
                    ).fetchone()
                assert killed is not None and killed[0] == 2  # one listener per replica
                second = await issue(a, "tool:t2")
                event = await events.next_change(within=5)
                assert json.loads(event["data"])["stop"]["stop_id"] == second["stop_id"]
                assert event["id"] == "2"


async def test_a_bad_revision_is_422(tmp_path: Path, store: dict[str, Any]) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        r = await client.get("/v1/watch?since=x", headers=auth("gateway"))
        assert r.status_code == 422


# -- failures ----------------------------------------------------------------------------------


async def test_a_failed_store_answers_503_not_a_traceback(tmp_path: Path, store: dict[str, Any]) -> None:
    async with control(tmp_path, registry=store) as (client, stores):
        await issue(client, "global")
        await stores.registry.aclose()
        for method, path, body in (
            ("POST", "/v1/stops", {"scope": "global", "reason": "r"}),
            ("GET", "/v1/stops", None),
            ("GET", "/v1/watch", None),
            ("GET", "/healthz", None),
        ):
            r = await client.request(method, path, json=body, headers=auth("operator"))
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "registry_unavailable"
        await stores.audit.aclose()
        r = await client.get("/v1/audit/verify", headers=auth("operator"))
        assert r.status_code == 503


# -- the CLI ---------------------------------------------------------------------------------


async def test_cli_stop_clear_stops_and_audit(
    tmp_path: Path,
    store: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with control(tmp_path, registry=store) as (client, _):
        url = str(client.base_url).rstrip("/")
        monkeypatch.setenv("HALTWIRE_CONTROL_URL", url)
        monkeypatch.setenv("HALTWIRE_TOKEN", TOKEN["operator"])
        assert await cli("stop", "--version", "a1@2", "--reason", "bad release") == 0
        stop_id = capsys.readouterr().out.strip()
        assert stop_id.startswith("stp_")
        assert await cli("stops", "--json") == 0
        assert [s["scope"] for s in json.loads(capsys.readouterr().out)] == ["version:a1@2"]

        assert await cli("clear", stop_id, "--reason", "rolled back", "--token", TOKEN["agent"]) == 1
        assert "needs role operator" in capsys.readouterr().err
        assert await cli("clear", stop_id, "--reason", "rolled back") == 0
        assert await cli("stops") == 0
        assert "no active stops" in capsys.readouterr().out
        assert await cli("stops", "--all") == 0
        assert "cleared by operator-1" in capsys.readouterr().out

        assert await cli("audit", "--json") == 0
        records = json.loads(capsys.readouterr().out)
        assert [(r["action"], r["outcome"]) for r in records] == [
            ("stop.issue", "ok"),
            ("stop.clear", "refused"),
            ("stop.clear", "ok"),
        ]
        assert await cli("audit", "verify") == 0
        assert "3 records verified" in capsys.readouterr().out


async def test_cli_audit_verify_exits_1_on_a_tampered_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    async with control(tmp_path) as (client, _):
        flags = ("--url", str(client.base_url), "--token", TOKEN["viewer"])
        await issue(client, "global")
        await issue(client, "tool:x")
        with sqlite3.connect(tmp_path / "control.db") as db:
            db.execute("UPDATE audit SET reason = 'nothing happened' WHERE seq = 1")
        assert await cli("audit", "verify", *flags) == 1
        assert "TAMPERED at seq 1" in capsys.readouterr().err


async def test_cli_exit_codes_for_usage_and_an_unreachable_control_plane(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HALTWIRE_CONTROL_URL", raising=False)
    monkeypatch.delenv("HALTWIRE_TOKEN", raising=False)
    assert await cli("stops") == 2
    with pytest.raises(SystemExit) as exc:
        await cli("stop", "--global", "--tool", "x", "--reason", "r")
    assert exc.value.code == 2
    assert await cli("stops", "--url", "http://127.0.0.1:9", "--token", "t", "--timeout", "2") == 3
    assert "cannot reach the control plane" in capsys.readouterr().err


def test_haltwire_control_exits_2_on_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from haltwire.cli import main

    path = tmp_path / "control.toml"
    path.write_text('[control]\nport = "x"\n\n[[identities]]\nname = "o"\nrole = "boss"\ntoken = "t"\n')
    with pytest.raises(SystemExit) as exc:
        main(["control", "--config", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: control.port:" in err
    assert f"{path}: identities[0].role:" in err


def test_a_relative_sqlite_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    from haltwire.control import load_control_config

    path = tmp_path / "control.toml"
    path.write_text('[registry]\npath = "data/h.db"\n')
    assert load_control_config(path).registry.path == tmp_path / "data" / "h.db"
