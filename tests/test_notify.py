"""Paging (``[[notify]]``) through a real control plane and real receivers on loopback.

A stop pages each receiver once, after its commit, with the run report the API serves; the
Slack and PagerDuty shapes; a receiver that is down is retried with backoff and paged once it is
up, and every outcome is audited; one that hangs adds nothing to the stop's answer; a page
waiting when the control plane stops is sent by the next one; config errors name their key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import tomli_w

from control_process import ControlCommand
from haltwire.config import ConfigError
from haltwire.control import create_app, pages, parse_control_config
from haltwire.control.stores import Stores, open_stores
from haltwire.serve import serving
from harness import postgres_section
from intents_harness import EXECUTOR_2, auth, claim, propose, settle, sqlite
from page_receiver import Receiver, receiving
from ports import free_port
from runs_harness import config_dict

pytestmark = pytest.mark.anyio

FAST = {"first_retry_s": 0.05, "max_retry_s": 0.2}


def config(registry: dict[str, Any], notify: list[dict[str, Any]], **control: Any) -> dict[str, Any]:
    data = config_dict(registry, True)
    data["identities"].append(EXECUTOR_2)
    data["notify"] = notify
    data["control"].update(control)
    return data


@asynccontextmanager
async def plane(
    registry: dict[str, Any], notify: list[dict[str, Any]]
) -> AsyncIterator[tuple[httpx2.AsyncClient, Stores]]:
    parsed = parse_control_config(config(registry, notify))
    async with open_stores(parsed) as stores:
        async with serving(create_app(parsed, stores)) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
                yield client, stores


async def incident(client: httpx2.AsyncClient) -> tuple[dict[str, Any], dict[str, str]]:
    """Run r-1 commits a refund, a second is pending when an operator stops the run: the stop."""
    r = await client.post("/v1/runs", json={"run_id": "r-1"}, headers=auth("agent"))
    assert r.status_code == 201, r.text
    done = (await propose(client, "k-done"))["intent_id"]
    assert (await claim(client)).json()["intent_id"] == done
    assert (await settle(client, done, "commit", outcome={"refund": "re_1"})).status_code == 200
    cancel = (await propose(client, "k-cancel"))["intent_id"]
    r = await client.post(
        "/v1/stops", json={"scope": "run:r-1", "reason": "refund loop"}, headers=auth("operator")
    )
    assert r.status_code == 201, r.text
    return r.json(), {"done": done, "cancel": cancel}


async def records(client: httpx2.AsyncClient, action: str) -> list[dict[str, Any]]:
    got = (await client.get("/v1/audit", headers=auth("operator"))).json()["records"]
    return [r for r in got if r["action"] == action]


async def eventually_audited(client: httpx2.AsyncClient, action: str, within: float = 10.0) -> dict[str, Any]:
    with anyio.fail_after(within):
        while not (found := await records(client, action)):
            await anyio.sleep(0.02)
    return found[0]


async def test_a_stop_pages_once_with_the_run_report_the_api_serves(store: dict[str, Any]) -> None:
    receiver = Receiver()
    async with receiving(receiver) as hook:
        notify = [{"name": "ops", "kind": "webhook", "url": f"{hook}/hook", "report_url_base": "https://cp.example"}]
        async with plane(store, notify) as (client, stores):
            stop, ids = await incident(client)
            await receiver.wait(pages=1)
            delivered = await eventually_audited(client, "page.deliver")
            await anyio.sleep(0.3)  # nothing more comes
            report = (await client.get("/v1/runs/r-1/report", headers=auth("operator"))).json()
            pages = await stores.pages.for_subject(stop["stop_id"])
    assert len(receiver.pages) == 1 and receiver.attempts == 1
    path, page, headers = receiver.pages[0]
    assert path == "/hook" and headers["idempotency-key"] == page["page_id"]
    assert page["schema"] == "haltwire.page/1" and page["event"] == "stop"
    assert (page["subject"], page["scope"], page["reason"]) == (stop["stop_id"], "run:r-1", "refund loop")
    assert page["run_id"] == "r-1" and page["report_url"] == "https://cp.example/v1/runs/r-1/report"
    assert page["stop"] == stop
    # The page is the report as it stood when sent: the report now has the delivery's record too.
    sent = page["report"]
    last = sent["timeline"][-1]["seq"]
    assert {**report, "timeline": [t for t in report["timeline"] if t["seq"] <= last]} == sent
    assert [t["action"] for t in report["timeline"] if t["seq"] > last] == ["page.deliver"]
    assert [i["intent_id"] for i in page["committed"]] == [ids["done"]] == [i["intent_id"] for i in report["completed"]]
    assert [i["intent_id"] for i in page["cancelled"]] == [ids["cancel"]] == [i["intent_id"] for i in report["cancelled"]]
    assert page["trigger"][-1]["action"] == "stop.issue" and page["trigger"][-1]["target"] == "run:r-1"
    assert "refund loop" in page["summary"] and "1 committed, 1 cancelled" in page["summary"]
    assert delivered["target"] == stop["stop_id"] and delivered["outcome"] == "ok"
    assert delivered["detail"]["attempts"] == 1 and delivered["detail"]["receiver"] == "ops"
    assert [(p.state, p.attempts) for p in pages] == [("delivered", 1)]


async def test_slack_and_pagerduty_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALTWIRE_TEST_SIGNING", "s" * 32)
    receiver = Receiver(status=202)
    async with receiving(receiver) as hook:
        notify: list[dict[str, Any]] = [
            {"name": "chat", "kind": "slack", "url": f"{hook}/slack", "report_url_base": "https://cp.example"},
            {"name": "pd", "kind": "pagerduty", "url": f"{hook}/pd", "routing_key": "R" * 32,
             "report_url_base": "https://cp.example"},
            {"name": "tenants-only", "kind": "webhook", "url": f"{hook}/never", "scopes": ["tenant"]},
            {"name": "shadow-only", "kind": "webhook", "url": f"{hook}/never", "on": ["shadow"]},
            {"name": "signed", "kind": "webhook", "url": f"{hook}/signed", "secret_env": "HALTWIRE_TEST_SIGNING"},
        ]
        async with plane(sqlite(tmp_path), notify) as (client, _):
            stop, ids = await incident(client)
            await receiver.wait(pages=3)
            await anyio.sleep(0.3)
            report = (await client.get("/v1/runs/r-1/report", headers=auth("operator"))).json()
    by_path = {path: page for path, page, _ in receiver.pages}
    assert sorted(by_path) == ["/pd", "/signed", "/slack"]  # the filtered receivers got nothing
    (signed,) = [(page, headers) for path, page, headers in receiver.pages if path == "/signed"]
    t, _, mac = signed[1]["haltwire-signature"].removeprefix("t=").partition(",v1=")
    raw = json.dumps(signed[0], separators=(",", ":")).encode()  # the body as sent
    assert hmac.compare_digest(mac, hmac.new(b"s" * 32, t.encode() + b"." + raw, hashlib.sha256).hexdigest())
    slack, pd = by_path["/slack"], by_path["/pd"]
    url = "https://cp.example/v1/runs/r-1/report"

    assert isinstance(slack["text"], str) and "run:r-1" in slack["text"] and "refund loop" in slack["text"]
    kinds = [b["type"] for b in slack["blocks"]]
    assert kinds[0] == "header" and kinds[-1] == "actions" and set(kinds) <= {"header", "section", "actions"}
    assert len(slack["blocks"][0]["text"]["text"]) <= 150 and slack["blocks"][0]["text"]["type"] == "plain_text"
    sections = [b["text"]["text"] for b in slack["blocks"] if b["type"] == "section"]
    assert all(b["text"]["type"] == "mrkdwn" for b in slack["blocks"] if b["type"] == "section")
    assert all(len(s) <= 3000 for s in sections)
    text = "\n".join(sections)
    assert ids["done"] in text and ids["cancel"] in text and "stop.issue" in text and "`r-1`" in text
    assert slack["blocks"][-1]["elements"] == [
        {"type": "button", "text": {"type": "plain_text", "text": "Run report"}, "url": url}
    ]

    assert set(pd) == {"routing_key", "event_action", "dedup_key", "payload", "links"}
    assert (pd["routing_key"], pd["event_action"], pd["dedup_key"]) == ("R" * 32, "trigger", stop["stop_id"])
    payload = pd["payload"]
    assert {"summary", "source", "severity", "custom_details"} <= set(payload)
    assert len(payload["summary"]) <= 1024 and payload["severity"] == "critical" and payload["source"] == "haltwire"
    details = payload["custom_details"]
    assert details["run_id"] == "r-1" and details["report_url"] == url
    assert [i["intent_id"] for i in details["committed"]] == [i["intent_id"] for i in report["completed"]]
    assert [i["intent_id"] for i in details["cancelled"]] == [i["intent_id"] for i in report["cancelled"]]
    assert details["trigger"][-1]["action"] == "stop.issue"
    assert pd["links"] == [{"href": url, "text": "Run report"}]


async def test_a_receiver_that_is_down_is_retried_with_backoff_then_paged(store: dict[str, Any]) -> None:
    port = free_port()
    receiver = Receiver()
    notify = [{"name": "ops", "kind": "webhook", "url": f"http://127.0.0.1:{port}/hook", **FAST}]
    async with plane(store, notify) as (client, stores):
        r = await client.post("/v1/stops", json={"scope": "agent:a1", "reason": "loop"}, headers=auth("operator"))
        assert r.status_code == 201
        stop = r.json()
        retry = await eventually_audited(client, "page.retry")
        assert retry["outcome"] == "refused" and retry["target"] == stop["stop_id"]
        assert "ops" in retry["reason"] and retry["detail"]["attempts"] == 1
        await anyio.sleep(0.5)  # a few more attempts, each after a longer wait; none audited
        (waiting,) = await stores.pages.for_subject(stop["stop_id"])
        assert waiting.state == "pending" and waiting.attempts >= 3
        assert len(await records(client, "page.retry")) == 1
        async with receiving(receiver, port=port):
            await receiver.wait(pages=1)
            delivered = await eventually_audited(client, "page.deliver")
        (page,) = await stores.pages.for_subject(stop["stop_id"])
    assert page.state == "delivered" and delivered["detail"]["attempts"] == page.attempts > waiting.attempts
    body = receiver.pages[0][1]
    # Not a run's stop: the scope and the reason, no report.
    assert (body["scope"], body["reason"], body["run_id"], body["report"]) == ("agent:a1", "loop", None, None)
    assert body["trigger"][-1]["action"] == "stop.issue"


async def test_a_receiver_that_hangs_adds_nothing_to_the_stop(tmp_path: Path) -> None:
    receiver = Receiver(hang=True)
    async with receiving(receiver) as hook:
        notify = [{"name": "ops", "kind": "webhook", "url": f"{hook}/hook", "timeout_s": 60}]
        async with plane(sqlite(tmp_path), notify) as (client, stores):
            for n in range(3):
                with anyio.fail_after(5):  # generous: a stop takes milliseconds; the hang is 60 s
                    r = await client.post(
                        "/v1/stops", json={"scope": f"run:r-{n}", "reason": "loop"}, headers=auth("operator")
                    )
                assert r.status_code == 201
                await receiver.wait(attempts=1)
            # The first page's post still hangs; the stops were answered all the same.
            assert receiver.attempts == 1 and not receiver.release.is_set() and receiver.pages == []
            receiver.release.set()
            await receiver.wait(pages=3)
    assert [p[1]["scope"] for p in receiver.pages] == ["run:r-0", "run:r-1", "run:r-2"]  # in order


async def test_a_page_given_up_or_dropped_is_audited(tmp_path: Path) -> None:
    refused = Receiver(status=400)  # the page's own fault: no retry
    async with receiving(refused) as hook:
        notify = [
            {"name": "bad", "kind": "webhook", "url": f"{hook}/hook", **FAST},
            {"name": "down", "kind": "webhook", "url": f"http://127.0.0.1:{free_port()}/", "max_pending": 1,
             "first_retry_s": 30, "max_retry_s": 30},
        ]
        async with plane(sqlite(tmp_path), notify) as (client, _):
            for n in range(3):
                r = await client.post("/v1/stops", json={"scope": f"run:r-{n}", "reason": "x"}, headers=auth("operator"))
                assert r.status_code == 201
            given_up = await eventually_audited(client, "page.give_up")
            dropped = await eventually_audited(client, "page.drop")
    assert given_up["detail"]["receiver"] == "bad" and "HTTP 400" in given_up["reason"]
    assert given_up["detail"]["attempts"] == 1 and refused.attempts >= 1
    assert dropped["detail"]["receiver"] == "down" and len(dropped["detail"]["pages"]) >= 1


async def test_a_page_still_owed_at_shutdown_is_sent_by_the_next_start(tmp_path: Path) -> None:
    port = free_port()
    registry = sqlite(tmp_path)
    notify = [{"name": "ops", "kind": "webhook", "url": f"http://127.0.0.1:{port}/hook", "first_retry_s": 0.05,
               "max_retry_s": 0.05}]
    async with plane(registry, notify) as (client, _):
        r = await client.post("/v1/stops", json={"scope": "global", "reason": "all"}, headers=auth("operator"))
        stop = r.json()
        await eventually_audited(client, "page.retry")
    receiver = Receiver()
    async with receiving(receiver, port=port), plane(registry, notify) as (client, _):
        await receiver.wait(pages=1)
        await eventually_audited(client, "page.deliver")
    assert receiver.pages[0][1]["subject"] == stop["stop_id"]


def test_config_errors_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = sqlite(tmp_path)

    def problem(notify: list[dict[str, Any]]) -> str:
        with pytest.raises(ConfigError) as caught:
            create_app(parse_control_config(config(registry, notify)))
        return str(caught.value)

    assert "notify[0].kind" in problem([{"name": "x", "kind": "email", "url": "http://h/"}])
    assert "notify[0]: url_env" in problem([{"name": "x", "kind": "webhook"}])
    assert "notify[0]: url:" in problem([{"name": "x", "kind": "webhook", "url": "ftp://h/"}])
    assert "routing_key_env" in problem([{"name": "x", "kind": "pagerduty"}])
    assert "notify[0]: scopes" in problem([{"name": "x", "kind": "webhook", "url": "http://h/", "scopes": ["team"]}])
    slack = {"name": "chat", "kind": "slack", "url": "https://hooks.slack.com/x"}
    with pytest.raises(ConfigError, match=r"notify.chat.url: a plain secret .* use url_env"):
        parse_control_config({"registry": registry, "notify": [slack]})
    pd = {"name": "pd", "kind": "pagerduty", "routing_key": "R" * 32}
    with pytest.raises(ConfigError, match=r"notify.pd.routing_key: a plain secret .* use routing_key_env"):
        parse_control_config({"registry": registry, "notify": [pd]})
    with pytest.raises(ConfigError, match="notify: names must be unique"):
        parse_control_config({"registry": registry, "notify": [{**slack, "url": None, "url_env": "X"}] * 2})
    monkeypatch.delenv("HALTWIRE_TEST_SLACK", raising=False)
    assert "notify.chat.url_env: the environment variable HALTWIRE_TEST_SLACK is not set" in problem(
        [{"name": "chat", "kind": "slack", "url_env": "HALTWIRE_TEST_SLACK"}]
    )
    monkeypatch.setenv("HALTWIRE_TEST_SLACK", "https://hooks.slack.com/services/T/B/X")
    create_app(parse_control_config(config(registry, [{"name": "chat", "kind": "slack", "url_env": "HALTWIRE_TEST_SLACK"}])))


async def test_other_rules_page_through_the_same_path(tmp_path: Path) -> None:
    # What an escalation or a shadow rule calls: pages.page with an Event, in a transaction of its
    # own here; the sender finds the page without a registry change (within POLL_S).
    receiver = Receiver()
    async with receiving(receiver) as hook:
        notify_: list[dict[str, Any]] = [
            {"name": "pd", "kind": "pagerduty", "url": f"{hook}/pd", "routing_key": "R" * 32},
            {"name": "stops-only", "kind": "webhook", "url": f"{hook}/never", "on": ["stop"]},
        ]
        parsed = parse_control_config(config(sqlite(tmp_path), notify_))
        async with open_stores(parsed) as stores:
            app = create_app(parsed, stores)
            async with serving(app):
                plane_ = app.state.plane
                event = pages.Event(
                    "shadow", "shd_1", "tenant:acme", "5 refunds in a minute", "tripwire-1", time.time(),
                    rule="refund-rate", detail={"would_stop": "tenant:acme"},
                )
                async with plane_.transaction():
                    ids = await pages.page(plane_, event)
                assert len(ids) == 1  # the stops-only receiver wants no shadow firing
                await receiver.wait(pages=1)
    ((path, pd, _),) = receiver.pages
    assert path == "/pd" and pd["dedup_key"] == "shd_1" and pd["payload"]["severity"] == "warning"
    details = pd["payload"]["custom_details"]
    assert (details["event"], details["rule"], details["detail"]) == ("shadow", "refund-rate", {"would_stop": "tenant:acme"})
    assert "would have stopped (shadow) tenant:acme (rule refund-rate)" in pd["payload"]["summary"]


async def test_haltwire_control_pages_once_from_its_main_process(tmp_path: Path) -> None:
    # The command's two processes share the outbox; only the main one sends, whichever listener
    # the stop came through (the agents' process wakes it over their socket pair).
    receiver = Receiver()
    async with receiving(receiver) as hook:
        command = ControlCommand(tmp_path, sqlite(tmp_path))
        data = tomllib.loads(command.config.read_text())
        data["notify"] = [{"name": "ops", "kind": "webhook", "url": f"{hook}/hook"}]
        command.config.write_text(tomli_w.dumps(data))
        try:
            await command.start()
            async with httpx2.AsyncClient(timeout=10) as http:
                for listener in ("admin", "agents"):
                    r = await http.post(
                        f"{command.url(listener)}/v1/stops",
                        json={"scope": f"tenant:{listener}", "reason": "x"},
                        headers=auth("operator"),
                    )
                    assert r.status_code == 201, r.text
            await receiver.wait(pages=2)
            await anyio.sleep(1.5)  # three sender polls: nothing more comes
        finally:
            await command.stop()
    assert sorted(page["scope"] for _, page, _ in receiver.pages) == ["tenant:admin", "tenant:agents"]


async def test_replicas_send_each_page_once(tmp_path: Path) -> None:
    receiver = Receiver()
    with postgres_section("test_notify") as section:
        async with receiving(receiver) as hook:
            notify_ = [{"name": "ops", "kind": "webhook", "url": f"{hook}/hook"}]
            async with plane(section, notify_) as (a, _), plane(section, notify_) as (b, _):
                stops = []
                for n in range(6):
                    r = await (a, b)[n % 2].post(
                        "/v1/stops", json={"scope": f"tenant:t{n}", "reason": "x"}, headers=auth("operator")
                    )
                    stops.append(r.json()["stop_id"])
                await receiver.wait(pages=6)
                await anyio.sleep(1.5)
                delivered = await records(a, "page.deliver")
    assert sorted(page["subject"] for _, page, _ in receiver.pages) == sorted(stops)
    assert sorted(r["target"] for r in delivered) == sorted(stops)


async def test_a_tripwires_stop_names_its_rule(tmp_path: Path) -> None:
    receiver = Receiver()
    async with receiving(receiver) as hook:
        async with plane(sqlite(tmp_path), [{"name": "ops", "kind": "webhook", "url": f"{hook}/"}]) as (client, _):
            r = await client.post("/v1/stops", json={"scope": "run:r-9", "reason": "6 refunds"}, headers=auth("tripwire"))
            assert r.status_code == 201, r.text
            await receiver.wait(pages=1)
    page = receiver.pages[0][1]
    assert (page["rule"], page["actor"]) == ("tripwire-1", "tripwire-1") and "(rule tripwire-1)" in page["summary"]


async def test_a_tripwire_names_the_rule_that_fired_and_no_other_role_may(tmp_path: Path) -> None:
    receiver = Receiver()
    async with receiving(receiver) as hook:
        async with plane(sqlite(tmp_path), [{"name": "ops", "kind": "webhook", "url": f"{hook}/"}]) as (client, _):
            body = {"scope": "run:r-9", "reason": "6 refunds", "rule": "refunds-per-run"}
            r = await client.post("/v1/stops", json=body, headers=auth("operator"))
            assert r.status_code == 422 and "only a tripwire" in r.json()["error"]["message"], r.text
            r = await client.post("/v1/stops", json=body, headers=auth("tripwire"))
            assert r.status_code == 201, r.text
            await receiver.wait(pages=1)
            (issued,) = [x for x in await records(client, "stop.issue") if x["outcome"] == "ok"]
    assert issued["detail"]["rule"] == "refunds-per-run"
    page = receiver.pages[0][1]
    assert (page["rule"], page["actor"]) == ("refunds-per-run", "tripwire-1")
