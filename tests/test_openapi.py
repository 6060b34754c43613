"""The control plane's OpenAPI document against the app that serves it.

The document must list exactly the routes the app serves, real responses must match it, and
schemathesis (its CLI, as a subprocess, against a real server on loopback) must find no 5xx,
no undocumented status code or content type and no response outside its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import jsonschema_rs
import pytest
from starlette.routing import Route

from control_harness import Events, auth, config_dict, issue
from haltwire.control import create_app, parse_control_config
from haltwire.control.routes import document, routes
from haltwire.limits import MAX_BODY_BYTES
from haltwire.serve import serving
from openapi_harness import SCHEMATHESIS_EXAMPLES, conforms, schemathesis, validate

pytestmark = pytest.mark.anyio

#: Lease keys (plain secrets: development only) and a second agent, to be refused another's run.
LEASES = {"signing_key": "k1", "keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
#: The credential broker with an ephemeral key (development only).
BROKER = {"ttl_s": 300, "audiences": ["orders"], "generate": True}
#: Another agent of agent-1's tenant: its runs answer 403 (another tenant's answer as unknown).
OTHER_AGENT = {"name": "agent-2", "role": "agent", "token": "tok-agent2", "agent": "a2", "tenant": "acme"}


@asynccontextmanager
async def control(tmp_path: Path, leases: bool = True) -> AsyncIterator[httpx2.AsyncClient]:
    """A control plane on loopback (SQLite), with ``[leases]`` unless told not: its client."""
    data = config_dict({"backend": "sqlite", "path": str(tmp_path / "control.db")})
    for identity in data["identities"]:
        if identity["role"] == "agent":
            identity.update(agent="a1", tenant="acme", version="2.1")
    data["identities"].append(OTHER_AGENT)
    if leases:
        data["leases"] = LEASES
    data["broker"] = BROKER  # a 501 is a server error to schemathesis: the broker is always on
    async with serving(create_app(parse_control_config(data))) as url:
        async with httpx2.AsyncClient(base_url=url, timeout=10) as client:
            yield client


def served() -> set[tuple[str, str]]:
    """(path, method) for every route; HEAD only where Starlette did not add it for a GET."""
    pairs = set()
    for route in routes:
        assert isinstance(route, Route)
        methods = set(route.methods or ())
        if "GET" in methods:
            methods.discard("HEAD")
        pairs |= {(route.path, m.lower()) for m in methods}
    return pairs


def test_the_document_lists_exactly_the_routes_the_app_serves() -> None:
    doc = document()
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert served() - documented == set(), "served but not in haltwire/control/openapi.py"
    assert documented - served() == set(), "documented but not served"
    # And each operation is named after the handler that serves it.
    handlers = {
        (r.path, m.lower()): r.endpoint.__name__
        for r in routes
        if isinstance(r, Route)
        for m in r.methods or ()
    }
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            assert operation["operationId"] == handlers[path, method]
    for schema in doc["components"]["schemas"].values():
        jsonschema_rs.meta.validate(schema)


async def test_the_docs_pages_show_the_document(tmp_path: Path) -> None:
    async with control(tmp_path) as client:
        for page in ("/docs", "/redoc"):
            r = await client.get(page)  # no token needed, like the document
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
            assert "/openapi.json" in r.text, page


async def test_real_responses_match_the_document(tmp_path: Path) -> None:
    async with control(tmp_path) as client:
        r = await client.get("/openapi.json")  # no token needed
        assert r.status_code == 200 and r.json() == json.loads(json.dumps(document()))

        assert conforms(await client.get("/healthz"), "get", "/healthz")["ok"] is True
        r = await client.post(
            "/v1/stops", json={"scope": "tool:x", "reason": "runaway"}, headers=auth("operator")
        )
        stop = conforms(r, "post", "/v1/stops")
        assert r.status_code == 201 and stop["cleared"] is False
        await issue(client, "agent:a1")
        listed = conforms(await client.get("/v1/stops", headers=auth("agent")), "get", "/v1/stops")
        assert [s["scope"] for s in listed["stops"]] == ["agent:a1"]

        clear = f"/v1/stops/{stop['stop_id']}/clear"
        template = "/v1/stops/{stop_id}/clear"
        r = await client.post(clear, json={"reason": "fixed"}, headers=auth("operator"))
        assert r.status_code == 200 and conforms(r, "post", template)["cleared"] is True
        r = await client.post(clear, json={"reason": "again"}, headers=auth("operator"))
        assert r.status_code == 409 and conforms(r, "post", template)["error"]["code"] == "already_cleared"
        r = await client.post("/v1/stops/stp_nope/clear", json={"reason": "x"}, headers=auth("operator"))
        assert r.status_code == 404 and conforms(r, "post", template)["error"]["code"] == "unknown_stop"
        r = await client.post(clear, json={"reason": ""}, headers=auth("operator"))
        assert r.status_code == 422 and conforms(r, "post", template)["error"]["code"] == "invalid_request"

        everything = conforms(await client.get("/v1/stops?all=1", headers=auth("viewer")), "get", "/v1/stops")
        assert {s["cleared"] for s in everything["stops"]} == {True, False}
        for body in (
            {"scope": "nowhere", "reason": "r"},
            {"scope": "tool:x"},
            {"scope": "tool:x", "reason": "r", "x": 1},
        ):
            r = await client.post("/v1/stops", json=body, headers=auth("operator"))
            assert r.status_code == 422 and conforms(r, "post", "/v1/stops")["error"]["retryable"] is False
        # Found with this document: an infinite expiry was stored, then every stops list was a 500.
        for expiry in (b"1e400", b"-Infinity", b"NaN"):
            raw = b'{"scope": "tool:x", "reason": "r", "expires_at": %s}' % expiry
            r = await client.post("/v1/stops", content=raw, headers=auth("operator"))
            assert (
                r.status_code == 422
                and conforms(r, "post", "/v1/stops")["error"]["code"] == "invalid_request"
            )
        assert (await client.get("/v1/stops", headers=auth("operator"))).status_code == 200
        r = await client.post("/v1/stops", json={"scope": "tool:x", "reason": "r"}, headers=auth("viewer"))
        assert r.status_code == 403 and conforms(r, "post", "/v1/stops")["error"]["needed_roles"]
        r = await client.get("/v1/stops", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and conforms(r, "get", "/v1/stops")["error"]["code"] == "unauthenticated"

        records = conforms(await client.get("/v1/audit", headers=auth("viewer")), "get", "/v1/audit")[
            "records"
        ]
        assert {r["outcome"] for r in records} == {"ok", "refused"}
        r = await client.get("/v1/audit", params={"target": stop["stop_id"]}, headers=auth("operator"))
        assert {rec["target"] for rec in conforms(r, "get", "/v1/audit")["records"]} == {stop["stop_id"]}
        r = await client.get("/v1/audit/verify", headers=auth("operator"))
        head = conforms(await client.get("/v1/audit/head", headers=auth("viewer")), "get", "/v1/audit/head")
        assert conforms(r, "get", "/v1/audit/verify") == {
            "ok": True,
            "checked": len(records),  # reads are not audited
            "first_bad_seq": None,
            "problem": None,
            "head_seq": head["seq"],
            "head_hash": head["hash"],
            "sealed": 0,
        }


def agent2() -> dict[str, str]:
    return {"Authorization": f"Bearer {OTHER_AGENT['token']}"}


async def test_run_and_lease_responses_match_the_document(tmp_path: Path) -> None:
    runs, run, lease, checkpoint = (
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/lease",
        "/v1/runs/{run_id}/checkpoint",
    )
    async with control(tmp_path) as client:
        r = await client.post(runs, json={"run_id": "r-1", "tools": ["lookup"]}, headers=auth("agent"))
        registered = conforms(r, "post", runs)
        assert r.status_code == 201 and registered["run"]["tools"] == ["lookup"]
        assert registered["checkpoint"] is None and registered["lease"]["run_id"] == "r-1"
        for body, status, code in (
            ({"run_id": "r-1"}, 409, "run_exists"),
            ({"agent_class": "nope"}, 422, "invalid_request"),
            ({"resume_from": "r-unknown"}, 422, "invalid_request"),
            ({"run_id": "no spaces"}, 422, "invalid_request"),
        ):
            r = await client.post(runs, json=body, headers=auth("agent"))
            assert r.status_code == status and conforms(r, "post", runs)["error"]["code"] == code, r.text
        r = await client.post(runs, json={}, headers=auth("operator"))
        assert r.status_code == 403 and conforms(r, "post", runs)["error"]["needed_roles"] == ["agent", "executor"]

        r = await client.post("/v1/runs/r-1/lease", headers=auth("agent"))
        assert r.status_code == 200 and conforms(r, "post", lease)["generation"] == 0
        r = await client.post("/v1/runs/r-1/lease", headers=agent2())
        assert r.status_code == 403 and conforms(r, "post", lease)["error"]["code"] == "forbidden"
        r = await client.post("/v1/runs/r-nope/lease", headers=auth("agent"))
        assert r.status_code == 404 and conforms(r, "post", lease)["error"]["code"] == "unknown_run"

        # Checkpoints: saved, read back, resumed from; none yet, and one too large.
        path = "/v1/runs/r-1/checkpoint"
        r = await client.put(path, json={"data": {"step": 1, "notes": ["a"]}}, headers=auth("agent"))
        assert r.status_code == 200 and conforms(r, "put", checkpoint)["seq"] == 1
        r = await client.get(path, headers=auth("viewer"))
        assert r.status_code == 200 and conforms(r, "get", checkpoint)["data"] == {"step": 1, "notes": ["a"]}
        r = await client.put(path, json={"data": "x" * MAX_BODY_BYTES}, headers=auth("agent"))
        assert r.status_code == 413 and conforms(r, "put", checkpoint)["error"]["code"] == "payload_too_large"
        r = await client.put(path, json={"data": [1]}, headers=auth("agent"))
        assert r.status_code == 422 and conforms(r, "put", checkpoint)["error"]["code"] == "invalid_request"
        r = await client.post(runs, json={"run_id": "r-2", "resume_from": "r-1"}, headers=auth("agent"))
        assert r.status_code == 201 and conforms(r, "post", runs)["checkpoint"]["seq"] == 1
        r = await client.get("/v1/runs/r-2/checkpoint", headers=auth("agent"))
        assert r.status_code == 404 and conforms(r, "get", checkpoint)["error"]["code"] == "no_checkpoint"

        r = await client.get("/v1/runs/r-1", headers=auth("agent"))
        assert r.status_code == 200 and conforms(r, "get", run)["ended_at"] is None
        r = await client.get("/v1/runs/r-1", headers=agent2())
        assert r.status_code == 403 and conforms(r, "get", run)["error"]["code"] == "forbidden"
        r = await client.get("/v1/runs/r-nope", headers=auth("operator"))
        assert r.status_code == 404 and conforms(r, "get", run)["error"]["code"] == "unknown_run"
        listed = conforms(await client.get(runs, params={"limit": "5"}, headers=auth("viewer")), "get", runs)
        assert [x["run_id"] for x in listed["runs"]] == ["r-2", "r-1"]
        r = await client.get(runs, params={"limit": "0"}, headers=auth("viewer"))
        assert r.status_code == 422 and conforms(r, "get", runs)["error"]["code"] == "invalid_request"

        # r-2 ends; a stop on r-1's agent then refuses its renewal and any new run of the agent.
        r = await client.post("/v1/runs/r-2/end", headers=auth("operator"))
        assert r.status_code == 200 and conforms(r, "post", "/v1/runs/{run_id}/end")["ended_at"] is not None
        r = await client.post("/v1/runs/r-2/lease", headers=auth("agent"))
        assert r.status_code == 409 and conforms(r, "post", lease)["error"]["code"] == "run_ended"
        r = await client.post(
            "/v1/leases/renew", json={"runs": ["r-1", "r-2", "r-nope"]}, headers=auth("agent")
        )
        batch = conforms(r, "post", "/v1/leases/renew")
        assert list(batch["leases"]) == ["r-1"]
        assert {k: v["code"] for k, v in batch["refused"].items()} == {
            "r-2": "run_ended",
            "r-nope": "unknown_run",
        }
        stop = await issue(client, "agent:a1")
        r = await client.post("/v1/runs/r-1/lease", headers=auth("agent"))
        error = conforms(r, "post", lease)["error"]
        assert r.status_code == 409 and error["code"] == "stopped"
        assert (error["scope"], error["stop_id"], error["reason"]) == ("agent:a1", stop["stop_id"], "runaway")
        r = await client.post("/v1/leases/renew", json={"runs": ["r-1"]}, headers=auth("agent"))
        batch = conforms(r, "post", "/v1/leases/renew")
        assert batch["leases"] == {} and batch["refused"]["r-1"]["stop_id"] == stop["stop_id"]
        r = await client.post(runs, json={"run_id": "r-3"}, headers=auth("agent"))
        error = conforms(r, "post", runs)["error"]
        assert r.status_code == 409 and (error["code"], error["scope"]) == ("stopped", "agent:a1")
        r = await client.post("/v1/leases/renew", json={"runs": []}, headers=auth("agent"))
        assert (
            r.status_code == 422
            and conforms(r, "post", "/v1/leases/renew")["error"]["code"] == "invalid_request"
        )


async def test_without_leases_the_lease_endpoints_answer_501_as_documented(tmp_path: Path) -> None:
    async with control(tmp_path, leases=False) as client:
        for path, template, body in (
            ("/v1/runs", "/v1/runs", {}),
            ("/v1/runs/r-1/lease", "/v1/runs/{run_id}/lease", None),
            ("/v1/leases/renew", "/v1/leases/renew", {"runs": ["r-1"]}),
        ):
            r = await client.post(path, json=body, headers=auth("agent"))
            assert r.status_code == 501, (path, r.text)
            assert conforms(r, "post", template)["error"]["code"] == "leases_not_configured"
        # The runs that need no lease still answer.
        r = await client.get("/v1/runs", headers=auth("operator"))
        assert conforms(r, "get", "/v1/runs") == {"runs": []}


async def test_a_checkpoint_that_is_not_json_is_refused(tmp_path: Path) -> None:
    """Python's JSON accepts NaN and 1e400 (infinity); a response may not carry them, so they
    are refused (422) before anything is stored."""
    async with control(tmp_path) as client:
        await client.post("/v1/runs", json={"run_id": "r-1"}, headers=auth("agent"))
        path = "/v1/runs/r-1/checkpoint"
        r = await client.put(path, content=b'{"data": {"x": NaN}}', headers=auth("agent"))
        assert r.status_code == 422, r.text
        conforms(r, "put", "/v1/runs/{run_id}/checkpoint")
        r = await client.get(path, headers=auth("agent"))
        assert r.status_code == 404 and conforms(r, "get", "/v1/runs/{run_id}/checkpoint")


async def test_watch_responses_match_the_document(tmp_path: Path) -> None:
    async with control(tmp_path) as client:
        stop = await issue(client, "tool:x")
        for headers, params, status in (
            ({}, {}, 401),
            (auth("tripwire"), {}, 403),
            (auth("operator"), {"since": "-1"}, 422),
            (auth("operator"), {"since": "soon"}, 422),
            (auth("operator"), {"since": str(2**63)}, 422),  # was a 500: SQLite's integers are 64-bit
            ({**auth("operator"), "Last-Event-ID": "x"}, {}, 422),
        ):
            async with client.stream("GET", "/v1/watch", headers=headers, params=params) as r:
                await r.aread()
                assert r.status_code == status
                conforms(r, "get", "/v1/watch")
        async with client.stream("GET", "/v1/watch", headers=auth("operator")) as r:
            assert r.status_code == 200
            conforms(r, "get", "/v1/watch")
            event = await Events(r).next_change()
        schema = document()["paths"]["/v1/watch"]["get"]["responses"]["200"]["content"]["text/event-stream"]
        validate(schema["schema"], event)
        # jsonschema treats contentSchema as an annotation only: check the data by hand.
        change = json.loads(event["data"])
        validate({"$ref": "#/components/schemas/Change"}, change)
        assert change["stop"]["stop_id"] == stop["stop_id"] and event["id"] == str(change["revision"])


async def seeded(client: httpx2.AsyncClient, role: str = "operator") -> str:
    """Stops to list, watch and clear, and for an agent runs to renew; the base URL."""
    if role != "agent":
        for scope in ("tool:x", "agent:a1", "global"):
            await issue(client, scope)
        return str(client.base_url).rstrip("/")
    # No stop on the agent's own scopes: its registrations must succeed for the links to
    # lead somewhere. One run is stopped, one ended, one checkpointed.
    for run_id in ("r-live", "r-stopped", "r-ended"):
        r = await client.post("/v1/runs", json={"run_id": run_id}, headers=auth("agent"))
        assert r.status_code == 201, r.text
    r = await client.put("/v1/runs/r-live/checkpoint", json={"data": {"step": 1}}, headers=auth("agent"))
    assert r.status_code == 200, r.text
    assert (await client.post("/v1/runs/r-ended/end", headers=auth("agent"))).status_code == 200
    for scope in ("tool:x", "run:r-stopped"):
        await issue(client, scope)
    return str(client.base_url).rstrip("/")


@pytest.mark.parametrize("examples", SCHEMATHESIS_EXAMPLES)
@pytest.mark.parametrize(
    ("role", "args"),
    [
        # Every phase, the stateful one issuing stops and clearing them through the link.
        ("operator", ()),
        # A role refused clear, audit and watch: the 403 answers against the document.
        ("tripwire", ("--phases", "coverage,fuzzing")),
        # The run endpoints' own role: registrations, renewals, checkpoints and ends, also
        # through a registration's links in the stateful phase. The watch, whose 200s cost a
        # request timeout each, has had its run as operator.
        ("agent", ("--exclude-path", "/v1/watch")),
    ],
)
async def test_schemathesis_finds_no_failure(
    tmp_path: Path, role: str, args: tuple[str, ...], examples: str
) -> None:
    """The coverage phase's cases (about a thousand) and ``examples`` fuzzed cases per operation:
    4 in the default run, 10 in the soak variant (``-m soak``)."""
    async with control(tmp_path) as client:
        url = await seeded(client, role)
        args = ("--max-examples", examples, *args)
        code, output = await schemathesis(tmp_path, url, role, f"{url}/openapi.json", *args)
    assert code == 0, output
    found = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", output)
    assert found is not None, output
    selected, total, tested = map(int, found.groups())
    # Every operation ran but those excluded on purpose.
    assert tested == selected == total - args.count("--exclude-path"), output
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated is not None and generated[1] == generated[2] and int(generated[1]) > 50, output


async def test_schemathesis_fails_on_a_response_outside_the_document(tmp_path: Path) -> None:
    """The run above can fail: here the document says /healthz's revision is a string."""
    broken = json.loads(json.dumps(document()))
    broken["components"]["schemas"]["Health"]["properties"]["revision"] = {"type": "string"}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    async with control(tmp_path) as client:
        url = await seeded(client)
        args = ("--include-path", "/healthz", "--phases", "fuzzing", "--max-examples", "3")
        code, output = await schemathesis(tmp_path, url, "operator", str(path), *args)
    assert code != 0, output
    assert "Response violates schema" in output and "/healthz" in output, output
