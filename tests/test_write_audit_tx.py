"""A write and its audit record are one transaction (issue 11, point 3), on SQLite and PostgreSQL.

The faults are real: a trigger makes the database refuse the audit record (or the intents a
stop cancels) the way a full disk or a broken constraint would, and the control plane's own
database connections are terminated. Whatever fails, no stop is enforced that is not audited,
no stop is written whose answer said it failed, and a request key makes the retry exact.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psycopg
import pytest

from control_harness import TOKEN, Events, auth, cli, control, dropped_trigger, failing_trigger, raw_sql

pytestmark = pytest.mark.anyio


def stop_body(scope: str, reason: str = "runaway") -> dict[str, Any]:
    return {"scope": scope, "reason": reason}


def keyed(role: str, key: str) -> dict[str, str]:
    return {**auth(role), "Idempotency-Key": key}


async def active(client: httpx2.AsyncClient) -> list[dict[str, Any]]:
    stops: list[dict[str, Any]] = (await client.get("/v1/stops?all=1", headers=auth("viewer"))).json()["stops"]
    return stops


async def audited(client: httpx2.AsyncClient, action: str) -> list[dict[str, Any]]:
    records = (await client.get("/v1/audit", headers=auth("viewer"))).json()["records"]
    return [r for r in records if r["action"] == action and r["outcome"] == "ok"]


async def no_change_within(events: Events, seconds: float) -> None:
    """Only heartbeats (and audit heads) arrive on the watch for ``seconds``. Read until then,
    not cancelled at then: cancelling a read would end the stream's reader."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        event = await events.next(within=2)
        assert "comment" in event, f"a change was pushed: {event}"


async def test_a_stop_whose_audit_record_fails_is_not_written_pushed_or_enforced(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, heartbeat_s=0.2, registry=store) as (client, _):
        async with client.stream("GET", "/v1/watch", headers=auth("gateway")) as watch:
            events = Events(watch)
            assert await events.next() == {"comment": "caught-up"}
            raw(*failing_trigger(store, "audit", "INSERT", "the audit disk is full"))

            r = await client.post("/v1/stops", json=stop_body("agent:a1"), headers=keyed("operator", "k-1"))
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert (error["code"], error["retryable"], error["written"]) == ("registry_unavailable", True, "no")
            assert "nothing was written" in error["message"]
            assert await active(client) == []
            assert (await client.get("/healthz")).json()["revision"] == 0
            await no_change_within(events, 1.0)

            # The operator retries with the same key once the database is whole again: one stop.
            raw(*dropped_trigger(store, "audit", "INSERT"))
            first = await client.post("/v1/stops", json=stop_body("agent:a1"), headers=keyed("operator", "k-1"))
            assert first.status_code == 201, first.text
            assert "idempotent-replayed" not in first.headers
            pushed = await events.next_change()
            assert pushed["event"] == "stop"
            again = await client.post("/v1/stops", json=stop_body("agent:a1"), headers=keyed("operator", "k-1"))
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.json() == first.json()
            await no_change_within(events, 0.6)  # the replay wrote and pushed nothing

        assert [s["stop_id"] for s in await active(client)] == [first.json()["stop_id"]]
        assert [r["target"] for r in await audited(client, "stop.issue")] == ["agent:a1"]
        verified = (await client.get("/v1/audit/verify", headers=auth("viewer"))).json()
        assert verified["ok"] is True, verified


async def test_a_clear_whose_audit_record_fails_leaves_the_stop_in_force(
    tmp_path: Path, store: dict[str, Any]
) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, registry=store) as (client, _):
        stop = (await client.post("/v1/stops", json=stop_body("tool:refund"), headers=auth("operator"))).json()
        raw(*failing_trigger(store, "audit", "INSERT", "the audit disk is full"))
        clear = f"/v1/stops/{stop['stop_id']}/clear"
        r = await client.post(clear, json={"reason": "fixed"}, headers=keyed("operator", "c-1"))
        assert r.status_code == 503 and r.json()["error"]["written"] == "no", r.text
        assert (await active(client))[0]["cleared_by"] is None

        raw(*dropped_trigger(store, "audit", "INSERT"))
        r = await client.post(clear, json={"reason": "fixed"}, headers=keyed("operator", "c-1"))
        assert r.status_code == 200 and r.json()["cleared_by"] == "operator-1", r.text
        again = await client.post(clear, json={"reason": "fixed"}, headers=keyed("operator", "c-1"))
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == r.json()
        # Without the key, a second clear is what it always was: already cleared.
        assert (await client.post(clear, json={"reason": "fixed"}, headers=auth("operator"))).status_code == 409


async def test_a_stop_is_answered_only_with_its_intents_cancelled(tmp_path: Path, store: dict[str, Any]) -> None:
    raw = raw_sql(store)
    async with control(tmp_path, registry=store) as (client, _):
        body = {
            "run_id": "r-1",
            "agent": "a1",
            "tenant": "acme",
            "version": "1",
            "tool": "refund",
            "arguments": {"order": "A-1"},
            "idempotency_key": "i-1",
        }
        intent = await client.post("/v1/intents", json=body, headers=auth("gateway"))
        assert intent.status_code == 201 and intent.json()["state"] == "pending", intent.text
        raw(*failing_trigger(store, "intents", "UPDATE", "intents locked"))

        r = await client.post("/v1/stops", json=stop_body("run:r-1"), headers=keyed("operator", "s-1"))
        assert r.status_code == 503 and r.json()["error"]["written"] == "no", r.text
        assert await active(client) == []
        got = await client.get(f"/v1/intents/{intent.json()['intent_id']}", headers=auth("operator"))
        assert got.json()["state"] == "pending"  # neither stopped nor cancelled: nothing happened

        raw(*dropped_trigger(store, "intents", "UPDATE"))
        r = await client.post("/v1/stops", json=stop_body("run:r-1"), headers=keyed("operator", "s-1"))
        assert r.status_code == 201, r.text
        got = await client.get(f"/v1/intents/{intent.json()['intent_id']}", headers=auth("operator"))
        assert (got.json()["state"], got.json()["stop_id"]) == ("cancelled", r.json()["stop_id"])
        cancelled = await audited(client, "intent.cancel")
        assert [c["detail"]["intents"] for c in cancelled] == [[intent.json()["intent_id"]]]


async def test_a_run_whose_audit_record_fails_is_not_registered(tmp_path: Path, store: dict[str, Any]) -> None:
    from runs_harness import plane  # a control plane with [leases]

    raw = raw_sql(store)
    async with plane(store) as (client, _):
        raw(*failing_trigger(store, "audit", "INSERT", "the audit disk is full"))
        r = await client.post("/v1/runs", json={"run_id": "r-audit"}, headers=auth("agent"))
        assert r.status_code == 503 and r.json()["error"]["written"] == "no", r.text
        raw(*dropped_trigger(store, "audit", "INSERT"))
        assert (await client.get("/v1/runs/r-audit", headers=auth("operator"))).status_code == 404
        r = await client.post("/v1/runs", json={"run_id": "r-audit"}, headers=auth("agent"))
        assert r.status_code == 201, r.text


async def test_request_keys_answer_the_first_request_and_refuse_another_use(tmp_path: Path) -> None:
    async with control(tmp_path) as (client, _):
        first = await client.post("/v1/stops", json=stop_body("tenant:t1"), headers=keyed("operator", "k"))
        assert first.status_code == 201
        other = await client.post("/v1/stops", json=stop_body("tenant:t2"), headers=keyed("operator", "k"))
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict", other.text
        # Keys are per identity: the tripwire's "k" is its own.
        mine = await client.post("/v1/stops", json=stop_body("tenant:t1"), headers=keyed("tripwire", "k"))
        assert mine.status_code == 201 and mine.json()["stop_id"] != first.json()["stop_id"]
        for bad in (b"", b"x" * 256, b"tab\there", "é".encode("latin-1")):
            headers = [(k.encode(), v.encode()) for k, v in auth("operator").items()]
            headers.append((b"Idempotency-Key", bad))
            r = await client.post("/v1/stops", json=stop_body("tenant:t3"), headers=headers)
            assert r.status_code == 422, (bad, r.text)
        assert len(await active(client)) == 2


async def test_dropped_database_connections_never_leave_a_stop_that_answered_failure(tmp_path: Path) -> None:
    """The issue's PostgreSQL round: the replica's database connections are terminated between
    requests; each stop request is retried with its key until answered. Every stop written is
    audited, none is written twice, and none that answered 503 "no" exists."""
    from harness import postgres_section

    with postgres_section() as section:
        async with control(tmp_path, heartbeat_s=0.2, registry=section) as (client, _):
            written: set[str] = set()
            for round_ in range(22):
                key = f"round-{round_}-{uuid.uuid4().hex[:6]}"
                with psycopg.connect(section["url"], autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                        (f"haltwire-control-{section['schema']}%",),
                    )
                answers = []
                for _ in range(5):
                    r = await client.post(
                        "/v1/stops", json=stop_body(f"run:r{round_}"), headers=keyed("operator", key)
                    )
                    answers.append(r.status_code)
                    if r.status_code == 503:
                        assert r.json()["error"]["written"] in ("no", "unknown"), r.text
                        if r.json()["error"]["written"] == "no":
                            scopes = {s["scope"] for s in await active(client)}
                            assert f"run:r{round_}" not in scopes, "a stop answered 'not written' was written"
                        continue
                    assert r.status_code == 201, r.text
                    written.add(r.json()["stop_id"])
                    break
                assert answers[-1] == 201, answers
            stops = await active(client)
            assert {s["stop_id"] for s in stops} == written and len(stops) == 22
            issued = await audited(client, "stop.issue")
            assert sorted(r["detail"]["stop_id"] for r in issued) == sorted(written)
            assert (await client.get("/v1/audit/verify", headers=auth("viewer"))).json()["ok"] is True


async def test_the_cli_retries_a_stop_whose_answer_was_lost_and_issues_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tcp_proxy import TcpProxy

    async with control(tmp_path) as (client, _):
        port = int(str(client.base_url).rstrip("/").rsplit(":", 1)[1])
        async with TcpProxy.running(port) as proxy, anyio.create_task_group() as tg:
            proxy.stall_after_headers()  # the stop is written; its answer never arrives whole
            status: list[int] = []

            async def stop() -> None:
                argv = ("stop", "--agent", "a1", "--reason", "lost answer", "--url", proxy.url)
                status.append(await cli(*argv, "--token", TOKEN["operator"], "--timeout", "1"))

            tg.start_soon(stop)
            with anyio.fail_after(10):
                while not await active(client):
                    await anyio.sleep(0.05)
            proxy.unblock()
        assert status == [0]
        out, err = capsys.readouterr()
        assert "retrying in 0.5 s with the same request key" in err
        stops = await active(client)
        assert [s["stop_id"] for s in stops] == [out.strip()]


async def test_a_commit_whose_answer_is_lost_says_unknown_and_the_key_tells(tmp_path: Path) -> None:
    """PostgreSQL: the COMMIT itself fails (a deferred constraint, checked only then), so the
    control plane cannot know from its side whether the write took: it says "unknown", and a
    repeat with the same key answers from the registry, never writing twice."""
    from harness import postgres_section

    with postgres_section() as section:
        raw = raw_sql(section)
        async with control(tmp_path, registry=section) as (client, _):
            raw(
                "CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the commit failed'; END $$",
                "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON audit "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit()",
            )
            r = await client.post("/v1/stops", json=stop_body("tool:refund"), headers=keyed("operator", "u-1"))
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["written"] == "unknown" and "same Idempotency-Key" in error["message"], error
            raw("DROP TRIGGER fail_at_commit ON audit", "DROP FUNCTION fail_at_commit()")
            first = await client.post("/v1/stops", json=stop_body("tool:refund"), headers=keyed("operator", "u-1"))
            again = await client.post("/v1/stops", json=stop_body("tool:refund"), headers=keyed("operator", "u-1"))
            assert first.status_code == again.status_code == 201
            assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()
            assert [s["stop_id"] for s in await active(client)] == [first.json()["stop_id"]]
