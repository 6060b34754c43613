"""The operators' dashboard over HTTP (issue 17): sign-in and its cookie, sessions that end,
CSRF on every write, roles exactly as the API's, the blast radius, the live stream, a run's
report and the audit log's verification. The browser test is ``test_dashboard_browser.py``."""

from __future__ import annotations

import re
import sqlite3
import tomllib
from pathlib import Path

import anyio
import httpx2
import pytest
import tomli_w

from control_process import ControlCommand
from dashboard_harness import (
    TOKENS,
    Stream,
    active_stops,
    audit_records,
    awaiting_approval,
    bearer,
    control_plane,
    csrf_of,
    intent_state,
    register,
    signed_in,
)
from runs_harness import LEASES

pytestmark = pytest.mark.anyio


def _cookie_flags(header: str) -> set[str]:
    return {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}


async def test_sign_in_gives_a_strict_http_only_cookie_and_sign_out_ends_the_session(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, httpx2.AsyncClient(base_url=plane.admin) as http:
        r = await http.get("/dashboard/")
        assert r.status_code == 200 and 'name="token"' in r.text  # the sign-in form
        r = await http.post("/dashboard/sign-in", data={"token": TOKENS["operator"]})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("haltwire_session=")
        assert _cookie_flags(cookie) == {"httponly", "samesite", "path", "max-age"}  # no Secure over http
        assert "samesite=strict" in cookie.lower() and "path=/dashboard" in cookie.lower()
        assert 3590 <= int(re.search(r"Max-Age=(\d+)", cookie).group(1)) <= 3600  # type: ignore[union-attr]
        page = await http.get("/dashboard/")
        assert page.status_code == 200 and 'id="who">oncall' in page.text and "stop-form" in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        session = http.cookies["haltwire_session"]

        r = await http.post("/dashboard/sign-out", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 200 and 'name="token"' in r.text
        assert "max-age=0" in r.headers["set-cookie"].lower() or "expires=" in r.headers["set-cookie"].lower()
        # The old cookie, sent again, names no session.
        again = await http.get("/dashboard/", cookies={"haltwire_session": session})
        assert again.status_code == 401 and "your session has ended" in again.text
        actions = [(a["actor"], a["action"]) for a in await audit_records(plane, "oncall")]
        assert actions == [("oncall", "dashboard.sign_in"), ("oncall", "dashboard.sign_out")]


async def test_the_cookie_is_secure_when_served_over_https(tmp_path: Path) -> None:
    # Behind a TLS-terminating proxy on loopback (uvicorn trusts its X-Forwarded-Proto).
    async with control_plane(tmp_path) as plane, httpx2.AsyncClient(base_url=plane.admin) as http:
        r = await http.post(
            "/dashboard/sign-in", data={"token": TOKENS["viewer"]}, headers={"X-Forwarded-Proto": "https"}
        )
        assert r.status_code == 303 and "secure" in _cookie_flags(r.headers["set-cookie"])


async def test_a_bad_token_or_a_program_s_token_cannot_sign_in(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, httpx2.AsyncClient(base_url=plane.admin) as http:
        for token, status, words in (
            ("tok-nobody", 401, "that token is not a current token of this control plane"),
            ("", 401, "that token is not a current token of this control plane"),
            (TOKENS["gateway"], 403, "a gateway token cannot sign in to the dashboard"),
            (TOKENS["tripwire"], 403, "a tripwire token cannot sign in to the dashboard"),
            (TOKENS["ops-bot"], 403, "a agent token cannot sign in"),
        ):
            r = await http.post("/dashboard/sign-in", data={"token": token})
            assert r.status_code == status and words in r.text, (token, r.status_code, r.text[-600:])
            assert "set-cookie" not in r.headers
        # A sign-in posted from another site's page is refused before the token is looked at.
        r = await http.post(
            "/dashboard/sign-in", data={"token": TOKENS["operator"]}, headers={"Origin": "https://evil.example"}
        )
        assert r.status_code == 403 and "another site" in r.text and "set-cookie" not in r.headers


async def test_a_write_without_the_session_s_csrf_token_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, signed_in(plane, "operator") as (http, csrf):
        form = {"scope": "agent:ops-bot", "reason": "runaway", "key": "k-1"}
        for sent, headers in (
            ({}, {}),
            ({"csrf": "not-the-token"}, {}),
            ({"csrf": csrf[:-1]}, {}),
            ({"csrf": csrf}, {"Origin": "https://evil.example"}),
        ):
            r = await http.post("/dashboard/stops", data={**form, **sent}, headers=headers)
            assert r.status_code == 403 and "Refused" in r.text, r.text
        assert await active_stops(plane) == []
        # The header does as well as the form field (for a script's write).
        r = await http.post("/dashboard/stops", data=form, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 303
        [stop] = await active_stops(plane)
        assert (stop["scope"], stop["issued_by"]) == ("agent:ops-bot", "oncall")
        # Pressed again (the same form, the same key): one stop.
        r = await http.post("/dashboard/stops", data={**form, "csrf": csrf})
        assert r.status_code == 303 and len(await active_stops(plane)) == 1
        page = await http.get("/dashboard/")
        assert "Already stopped by this form: agent:ops-bot" in page.text


async def test_an_expired_session_is_signed_out_and_its_writes_refused(tmp_path: Path) -> None:
    async with control_plane(tmp_path, session_s=60) as plane, signed_in(plane, "operator") as (http, csrf):
        real = plane.sessions.clock
        plane.sessions.clock = lambda: real() + 61
        r = await http.post("/dashboard/stops", data={"csrf": csrf, "scope": "global", "reason": "late"})
        assert r.status_code == 401 and "your session has ended; sign in again" in r.text
        r = await http.get("/dashboard/")
        assert r.status_code == 401 and 'name="token"' in r.text
        r = await http.get("/dashboard/events")
        assert r.status_code == 401
        assert await active_stops(plane) == []


async def test_a_viewer_sees_everything_and_no_button_and_a_forged_write_is_refused_and_audited(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path) as plane:
        await register(plane, "ops-bot", "run-1")
        intent = await awaiting_approval(plane, "run-1")
        async with httpx2.AsyncClient(base_url=plane.admin) as api:
            r = await api.post("/v1/stops", json={"scope": "tenant:beta", "reason": "drill"}, headers=bearer("operator"))
            stop_id = r.json()["stop_id"]
        async with signed_in(plane, "viewer") as (http, csrf):
            page = (await http.get("/dashboard/")).text
            assert "tenant:beta" in page and "run-1" in page and intent in page  # sees everything
            for button in ("stop-form", "Stop…", ">Clear<", ">Approve<", ">Reject<", "Stop run…"):
                assert button not in page, button
            r = await http.get("/dashboard/stop", params={"kind": "global", "reason": "x"})
            assert r.status_code == 403 and "role viewer may not stop.issue" in r.text
            # Forged: the viewer's own session and CSRF token, the operator's form.
            forged = {"csrf": csrf, "scope": "global", "reason": "forged", "key": "f-1"}
            r = await http.post("/dashboard/stops", data=forged)
            assert r.status_code == 403 and "role viewer may not stop.issue" in r.text
            r = await http.post(f"/dashboard/stops/{stop_id}/clear", data={"csrf": csrf, "reason": "forged"})
            assert r.status_code == 403
            r = await http.post(f"/dashboard/intents/{intent}/approve", data={"csrf": csrf})
            assert r.status_code == 403
        assert [s["scope"] for s in await active_stops(plane)] == ["tenant:beta"]
        assert await intent_state(plane, intent) == "awaiting_approval"
        refused = [(a["actor"], a["action"]) for a in await audit_records(plane) if a["outcome"] == "refused"]
        assert refused == [("watcher", "stop.issue"), ("watcher", "stop.clear"), ("watcher", "intent.approve")]


async def test_the_dashboard_is_served_on_the_admin_listener_only(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        for url in (plane.enforcement, plane.agents):
            async with httpx2.AsyncClient(base_url=url) as http:
                assert (await http.get("/dashboard/")).status_code == 404
                r = await http.post("/dashboard/sign-in", data={"token": TOKENS["operator"]})
                assert r.status_code == 404 and "set-cookie" not in r.headers
                assert (await http.get("/dashboard/static/dashboard.js")).status_code == 404
        async with httpx2.AsyncClient(base_url=plane.admin) as http:
            r = await http.get("/dashboard/static/dashboard.js")
            assert r.status_code == 200 and "EventSource" in r.text
            assert (await http.get("/dashboard/static/../__init__.py")).status_code == 404


def _lease_of(page: httpx2.Response, run_id: str) -> float | None:
    """When the run's latest lease was granted, as its row in the runs panel says."""
    found = re.search(rf'<tr data-run="{run_id}">.*?(?:data-lease="([0-9.]+)"|</tr>)', page.text, re.S)
    assert found, page.text[-2000:]
    return float(found.group(1)) if found.group(1) else None


def _radius(html: str) -> tuple[int, str, str, str]:
    def field(name: str) -> str:
        found = re.search(rf'id="blast-{name}">([^<]*)<', html)
        assert found, html[-2000:]
        return found.group(1)

    return int(field("runs")), field("tenants"), field("agents"), field("versions")


async def test_the_review_shows_each_scope_kind_s_blast_radius_among_live_runs(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        await register(plane, "ops-bot", "run-1", ("lookup_order",))
        await register(plane, "ops-bot", "run-2", ("lookup_order",))
        await register(plane, "billing-bot", "run-3", ("refund",))
        async with httpx2.AsyncClient(base_url=plane.agents) as http:
            assert (await http.post("/v1/runs/run-2/end", headers=bearer("ops-bot"))).status_code == 200
        async with signed_in(plane, "operator") as (http, _):
            cases = {
                ("agent", "ops-bot"): (1, "acme", "ops-bot", "ops-bot@1.0"),
                ("tenant", "acme"): (2, "acme", "billing-bot, ops-bot", "billing-bot@2.0, ops-bot@1.0"),
                ("version", "billing-bot@2.0"): (1, "acme", "billing-bot", "billing-bot@2.0"),
                ("run", "run-3"): (1, "acme", "billing-bot", "billing-bot@2.0"),
                ("run", "run-2"): (0, "none", "none", "none"),  # ended: not live
                ("tool", "lookup_order"): (1, "acme", "ops-bot", "ops-bot@1.0"),
                ("global", ""): (2, "acme", "billing-bot, ops-bot", "billing-bot@2.0, ops-bot@1.0"),
                ("tenant", "beta"): (0, "none", "none", "none"),
                ("model", "gpt-x"): (0, "none", "none", "none"),
            }
            for (kind, value), expected in cases.items():
                r = await http.get("/dashboard/stop", params={"kind": kind, "value": value, "reason": "why"})
                assert r.status_code == 200, r.text
                assert _radius(r.text) == expected, (kind, value)
            r = await http.get("/dashboard/stop", params={"kind": "model", "value": "gpt-x", "reason": "why"})
            assert "runs do not declare their models" in r.text
            for params, words in (
                ({"kind": "agent", "value": "ops-bot", "reason": " "}, "a stop needs a reason"),
                ({"kind": "agent", "value": "", "reason": "why"}, "say which agent to stop"),
                ({"kind": "version", "value": "nobody", "reason": "why"}, "a version scope is version:AGENT@VERSION"),
                ({"kind": "planet", "value": "x", "reason": "why"}, "kind: one of run, tenant"),
            ):
                r = await http.get("/dashboard/stop", params=params)
                assert r.status_code == 422 and words in r.text, (params, r.text[-800:])
        assert await active_stops(plane) == []  # reviewing writes nothing


async def test_clear_and_reject_need_a_reason_and_are_audited_as_the_operator(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, signed_in(plane, "operator") as (http, csrf):
        intent = await awaiting_approval(plane)
        r = await http.post(f"/dashboard/intents/{intent}/reject", data={"csrf": csrf, "reason": ""})
        assert r.status_code == 422 and "a rejection needs a reason" in r.text
        r = await http.post(f"/dashboard/intents/{intent}/reject", data={"csrf": csrf, "reason": "not this one"})
        assert r.status_code == 303 and await intent_state(plane, intent) == "rejected"
        r = await http.post(f"/dashboard/intents/{intent}/approve", data={"csrf": csrf})
        assert r.status_code == 409 and "was not approved" in r.text  # said in words, not a traceback

        await http.post("/dashboard/stops", data={"csrf": csrf, "scope": "tool:refund", "reason": "bad refunds"})
        [stop] = await active_stops(plane)
        r = await http.post(f"/dashboard/stops/{stop['stop_id']}/clear", data={"csrf": csrf, "reason": ""})
        assert r.status_code == 422 and len(await active_stops(plane)) == 1
        r = await http.post(f"/dashboard/stops/{stop['stop_id']}/clear", data={"csrf": csrf, "reason": "fixed"})
        assert r.status_code == 303 and await active_stops(plane) == []
        assert "Cleared tool:refund" in (await http.get("/dashboard/")).text
        done = [
            (a["actor"], a["role"], a["action"], a["outcome"])
            for a in await audit_records(plane)
            if a["action"] in ("intent.reject", "stop.issue", "stop.clear")
        ]
        assert done == [
            ("oncall", "operator", "intent.reject", "refused"),
            ("oncall", "operator", "intent.reject", "ok"),
            ("oncall", "operator", "stop.issue", "ok"),
            ("oncall", "operator", "stop.clear", "refused"),
            ("oncall", "operator", "stop.clear", "ok"),
        ]


async def test_the_live_stream_pushes_a_stop_as_it_is_issued_and_ends_with_the_session(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, signed_in(plane, "viewer") as (http, _):
        async with http.stream("GET", "/dashboard/events") as response:
            assert response.status_code == 200
            events = Stream(response)
            first: dict[str, str] = {}
            with anyio.fail_after(5):
                while "tick" not in first:
                    kind, data = await events.next_event()
                    first[kind] = data
            assert set(first) == {"stops", "runs", "intents", "refusals", "firings", "tick"}
            assert "No active stop" in first["stops"]
            async with httpx2.AsyncClient(base_url=plane.admin) as api:
                r = await api.post("/v1/stops", json={"scope": "agent:ops-bot", "reason": "loop"}, headers=bearer("operator"))
                assert r.status_code == 201
            with anyio.fail_after(3):  # woken by the write, not by the next look
                while True:
                    kind, data = await events.next_event()
                    if kind == "stops":
                        break
            assert "agent:ops-bot" in data and "loop" in data
            plane.sessions.close(http.cookies["haltwire_session"])
            with anyio.fail_after(5):
                while kind != "signed-out":
                    kind, data = await events.next_event()


async def test_a_run_s_page_reports_its_stops_and_cancelled_intents_and_the_audit_page_verifies(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path) as plane, signed_in(plane, "viewer") as (http, _):
        await register(plane, "ops-bot", "run-1", ("refund",))
        intent = await awaiting_approval(plane, "run-1")
        async with httpx2.AsyncClient(base_url=plane.admin) as api:
            await api.post("/v1/stops", json={"scope": "run:run-1", "reason": "refund loop"}, headers=bearer("operator"))
        page = (await http.get("/dashboard/runs/run-1")).text
        stops = page[page.index('id="run-stops"') : page.index("<h2>Completed")]
        assert "run:run-1" in stops and "refund loop" in stops and "active" in stops
        cancelled = page[page.index("<h2>Cancelled") : page.index("<h2>Failed")]
        assert intent in cancelled and "cancelled" in cancelled
        timeline = page[page.index('id="timeline"') :]
        assert all(a in timeline for a in ("run.register", "intent.create", "stop.issue", "intent.cancel"))
        r = await http.get("/dashboard/runs/run-404")
        assert r.status_code == 404 and "no run has the id run-404" in r.text

        audit = await http.get("/dashboard/audit")
        assert audit.status_code == 200 and "<strong>Verified:</strong>" in audit.text
    with sqlite3.connect(tmp_path / "control.db") as db:
        db.execute("UPDATE audit SET reason = 'edited' WHERE seq = 2")
    async with control_plane(tmp_path) as plane, signed_in(plane, "operator") as (http, _):
        audit = await http.get("/dashboard/audit")
        assert "<strong>Tampered or broken:</strong>" in audit.text and "first bad record: 2" in audit.text


async def test_the_api_answers_the_same_blast_radius(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        await register(plane, "ops-bot", "run-1", ("lookup_order",))
        await register(plane, "billing-bot", "run-2")
        async with httpx2.AsyncClient(base_url=plane.admin) as api:
            r = await api.get("/v1/blast-radius", params={"scope": "tenant:acme"}, headers=bearer("viewer"))
            assert r.status_code == 200, r.text
            assert r.json() == {
                "scope": "tenant:acme",
                "runs": 2,
                "tenants": ["acme"],
                "agents": ["billing-bot", "ops-bot"],
                "versions": ["billing-bot@2.0", "ops-bot@1.0"],
                "run_ids": ["run-2", "run-1"],
                "at_least": False,
                "note": "",
            }
            r = await api.get("/v1/blast-radius", params={"scope": "agent:"}, headers=bearer("operator"))
            assert r.status_code == 422 and "empty or padded value" in r.json()["error"]["message"]
            r = await api.get("/v1/blast-radius", headers=bearer("operator"))
            assert r.status_code == 422
            r = await api.get("/v1/blast-radius", params={"scope": "global"}, headers=bearer("tripwire"))
            assert r.status_code == 403


@pytest.mark.slow
async def test_haltwire_control_serves_it_on_the_admin_port_and_its_streams_take_no_in_flight_slot(
    tmp_path: Path,
) -> None:
    """The real command (two processes): the admin listener's cap on requests in flight (2 here)
    does not count open live streams, so three open tabs leave the stop button served."""
    command = ControlCommand(tmp_path, {"backend": "sqlite", "path": str(tmp_path / "c.db")})
    data = tomllib.loads(command.config.read_text())
    data["control"]["admin_listener"] = {"max_in_flight": 2}
    data["leases"] = LEASES
    command.config.write_text(tomli_w.dumps(data))
    try:
        await command.start()
        for listener in ("agents", "enforcement"):
            async with httpx2.AsyncClient(base_url=command.url(listener)) as http:
                assert (await http.get("/dashboard/")).status_code == 404
        async with httpx2.AsyncClient(base_url=command.url("admin"), timeout=10) as http:
            r = await http.post("/dashboard/sign-in", data={"token": "tok-operator"})
            assert r.status_code == 303, r.text
            async with (
                http.stream("GET", "/dashboard/events") as one,
                http.stream("GET", "/dashboard/events") as two,
                http.stream("GET", "/dashboard/events") as three,
            ):
                for response in (one, two, three):
                    assert response.status_code == 200
                    with anyio.fail_after(5):
                        assert (await Stream(response).next_event())[0] == "stops"
                page = await http.get("/dashboard/")
                assert page.status_code == 200 and "review-stop" in page.text
                r = await http.get("/dashboard/stop", params={"kind": "global", "reason": "drill"})
                assert r.status_code == 200 and 'id="blast-runs">0<' in r.text
            # A lease granted by the agents' process is shown by the admin process.
            async with httpx2.AsyncClient(base_url=command.url("agents")) as agents:
                r = await agents.post("/v1/runs", json={"run_id": "run-1"}, headers={"Authorization": "Bearer tok-agent"})
                assert r.status_code == 201, r.text
            granted = r.json()["lease"]["expires_at"] - r.json()["lease"]["ttl_s"]
            with anyio.fail_after(10):
                while (lease := _lease_of(await http.get("/dashboard/"), "run-1")) is None:
                    await anyio.sleep(0.2)
            assert abs(lease - granted) < 0.01
    finally:
        await command.stop()


async def test_the_example_config_s_operator_and_viewer_sign_in_as_docs_dashboard_md_says(tmp_path: Path) -> None:
    from haltwire.control import AdminOnly, create_app, load_control_config
    from haltwire.serve import serving

    example = Path(__file__).parent.parent / "examples" / "control.toml"
    config = load_control_config(example)
    assert config.control.admin_port == 8701  # the address docs/dashboard.md gives
    assert "http://127.0.0.1:8701/dashboard/" in (example.parent.parent / "docs" / "dashboard.md").read_text()
    registry = config.registry.model_copy(update={"path": tmp_path / "control.db"})
    app = create_app(config.model_copy(update={"registry": registry}))
    async with serving(AdminOnly(app), graceful_s=1) as url, httpx2.AsyncClient(base_url=url) as http:
        for token, name, stop_button in (("tok-oncall", "oncall", True), ("tok-viewer", "night-watch", False)):
            http.cookies.clear()
            assert (await http.post("/dashboard/sign-in", data={"token": token})).status_code == 303
            page = (await http.get("/dashboard/")).text
            assert f'id="who">{name}' in page and ("review-stop" in page) is stop_button


async def test_panels_read_once_for_every_tab_carry_each_session_s_own_csrf_token(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        async with httpx2.AsyncClient(base_url=plane.admin) as api:
            r = await api.post("/v1/stops", json={"scope": "tenant:beta", "reason": "drill"}, headers=bearer("operator"))
            assert r.status_code == 201
        async with signed_in(plane, "operator") as (one, csrf_one), signed_in(plane, "operator") as (two, csrf_two):
            assert csrf_one != csrf_two
            for http, mine, theirs in ((one, csrf_one, csrf_two), (two, csrf_two, csrf_one)):
                page = (await http.get("/dashboard/")).text
                panel = page[page.index('id="panel-stops"') : page.index('id="panel-runs"')]
                assert f'name="csrf" value="{mine}"' in panel and theirs not in page
            # The other session's token is refused on this session's write.
            r = await one.post(f"/dashboard/stops/{r.json()['stop_id']}/clear", data={"csrf": csrf_two, "reason": "x"})
            assert r.status_code == 403 and len(await active_stops(plane)) == 1


async def test_a_run_s_row_shows_when_its_lease_was_last_granted(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, signed_in(plane, "viewer") as (http, _):
        first = (await register(plane, "ops-bot", "run-1"))["lease"]
        with anyio.fail_after(5):
            while (lease := _lease_of(await http.get("/dashboard/"), "run-1")) is None:
                await anyio.sleep(0.1)
        assert abs(lease - (first["expires_at"] - first["ttl_s"])) < 0.01
        await anyio.sleep(0.05)
        async with httpx2.AsyncClient(base_url=plane.agents) as agents:
            r = await agents.post("/v1/runs/run-1/lease", headers=bearer("ops-bot"))
            assert r.status_code == 200, r.text
        renewed = r.json()["expires_at"] - r.json()["ttl_s"]
        assert renewed > lease
        with anyio.fail_after(5):
            while (lease := _lease_of(await http.get("/dashboard/"), "run-1")) != pytest.approx(renewed, abs=0.01):
                await anyio.sleep(0.1)
