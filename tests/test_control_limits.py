"""Bounded inputs at the control plane: every field of every body, path and query is bounded in
length and characters, refused 422 naming the field and the limit without echoing the input,
and what the append-only audit log keeps of a refused write is bounded too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from haltwire.control.plane import MAX_AUDIT_TEXT, excerpt
from haltwire.limits import MAX_ID_CHARS, MAX_ITEMS, MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_SCOPE_CHARS
from haltwire.scope import Scope, ScopeError
from plane_harness import bearer, full_plane

pytestmark = pytest.mark.anyio

#: What marks an oversized value, to see that no answer carries it back (as ECHO).
MARK = "Zq"
ECHO = MARK * 20
#: Any audit record, serialized: an excerpt of a refused value is ~400 characters.
AUDIT_RECORD_MAX = 4096
INTENT = "int_00000000000000aa"


def test_a_long_text_is_kept_as_its_start_its_length_and_its_hash() -> None:
    assert excerpt("short") == "short"
    long = "x" * (MAX_AUDIT_TEXT + 1)
    kept = excerpt(long)
    assert len(kept) < 400 and kept.startswith("x" * 256) and f"({len(long)} characters, sha256 " in kept


@pytest.mark.parametrize("text", ["tool:" + "t" * MAX_SCOPE_CHARS, "agent:ops\x00bot", "tenant:a\nb"])
def test_oversized_scopes_and_control_characters_are_not_scopes(text: str) -> None:
    with pytest.raises(ScopeError) as refused:
        Scope.parse(text)
    assert len(str(refused.value)) < 200, "the refusal does not echo the input"


def intent(**overrides: Any) -> dict[str, Any]:
    base = {"agent": "a1", "tenant": "acme", "version": "2.1", "tool": "refund", "arguments": {"n": 1}}
    return {**base, "idempotency_key": "k-1", **overrides}


def big(n: int) -> str:
    return MARK * (n // 2 + 1)


#: (role, method, path, body, the field the refusal names, words of the limit it names, action
#: audited or None for a read). The oversized values carry MARK; none may come back.
BODIES: list[tuple[str, str, str, Any, str, str, str | None]] = [
    ("agent", "POST", "/v1/runs", {"tools": [big(MAX_NAME_CHARS)]}, "tools.0", f"at most {MAX_NAME_CHARS}", "run.register"),
    ("agent", "POST", "/v1/runs", {"tools": ["t"] * (MAX_ITEMS + 1)}, "tools", f"at most {MAX_ITEMS}", "run.register"),
    ("agent", "POST", "/v1/runs", {"tools": ["a\x00b"]}, "tools.0", "control characters", "run.register"),
    ("agent", "POST", "/v1/runs", {"agent_class": big(100_000)}, "agent_class", f"at most {MAX_NAME_CHARS}", "run.register"),
    ("agent", "POST", "/v1/runs", {"agent_class": "de\nfault"}, "agent_class", "control characters", "run.register"),
    ("agent", "POST", "/v1/runs", {"run_id": big(MAX_ID_CHARS)}, "run_id", f"1 to {MAX_ID_CHARS}", "run.register"),
    ("agent", "POST", "/v1/runs", {"resume_from": big(MAX_ID_CHARS)}, "resume_from", f"1 to {MAX_ID_CHARS}", "run.register"),
    ("agent", "POST", "/v1/runs", {"resume_from": "r\x00"}, "resume_from", f"1 to {MAX_ID_CHARS}", "run.register"),
    ("agent", "POST", "/v1/leases/renew", {"runs": [big(MAX_ID_CHARS)]}, "runs.0", f"1 to {MAX_ID_CHARS}", None),
    ("agent", "POST", "/v1/leases/renew", {"runs": ["r"] * (MAX_ITEMS + 1)}, "runs", f"at most {MAX_ITEMS}", None),
    ("agent", "PUT", "/v1/runs/r-1/checkpoint", {"data": {}, big(500_000): 1}, MARK, "Extra inputs", "checkpoint.save"),
    ("agent", "POST", "/v1/runs/r-1/credentials", {"audience": big(MAX_NAME_CHARS)}, "audience", f"at most {MAX_NAME_CHARS}", "credential.issue"),
    ("gateway", "POST", "/v1/intents", intent(agent=big(MAX_NAME_CHARS)), "agent", f"at most {MAX_NAME_CHARS}", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(tenant="ac\x00me"), "tenant", "control characters", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(version=big(MAX_NAME_CHARS)), "version", f"at most {MAX_NAME_CHARS}", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(tool=big(MAX_NAME_CHARS)), "tool", f"at most {MAX_NAME_CHARS}", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(idempotency_key=big(300)), "idempotency_key", "at most 256", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(idempotency_key="k\x00"), "idempotency_key", "control characters", "intent.create"),
    ("gateway", "POST", "/v1/intents", intent(run_id="r/1"), "run_id", f"1 to {MAX_ID_CHARS}", "intent.create"),
    ("executor", "POST", f"/v1/intents/{INTENT}/fail", {"error": big(MAX_REASON_CHARS)}, "error", f"at most {MAX_REASON_CHARS}", "intent.fail"),
    ("executor", "POST", f"/v1/intents/{INTENT}/fail", {"error": "e\x00"}, "error", "control characters", "intent.fail"),
    ("operator", "POST", f"/v1/intents/{INTENT}/reject", {"reason": big(MAX_REASON_CHARS)}, "reason", f"at most {MAX_REASON_CHARS}", "intent.reject"),
    ("operator", "POST", "/v1/stops", {"scope": "global", "reason": "r", big(500_000): 1}, MARK, "Extra inputs", "stop.issue"),
    ("operator", "POST", "/v1/stops", {"scope": "tool:" + big(1000), "reason": "r"}, "scope", f"at most {MAX_SCOPE_CHARS}", "stop.issue"),
    ("operator", "POST", "/v1/stops/stp_1/clear", {"reason": big(MAX_REASON_CHARS)}, "reason", f"at most {MAX_REASON_CHARS}", "stop.clear"),
]  # fmt: skip

#: Paths, queries and headers: (role, path, extra headers, the parameter named, the limit's words).
PARAMETERS: list[tuple[str, str, dict[str, str], str, str]] = [
    ("operator", "/v1/runs/" + big(1000), {}, "run_id", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/runs/r%00" + MARK, {}, "run_id", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/runs/" + big(1000) + "/report", {}, "run_id", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/intents/" + big(1000), {}, "intent_id", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/runs?limit=9" + "9" * 5000, {}, "limit", f"1 to {MAX_ITEMS}"),
    ("operator", "/v1/runs?limit=" + big(5000), {}, "limit", f"1 to {MAX_ITEMS}"),
    ("operator", "/v1/intents?state=" + big(5000), {}, "state", "pending"),
    ("operator", "/v1/intents?run=" + big(1000), {}, "run", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/intents?run=r%00" + MARK, {}, "run", f"1 to {MAX_ID_CHARS}"),
    ("operator", "/v1/audit?target=" + big(5000), {}, "target", f"at most {MAX_AUDIT_TEXT}"),
    ("operator", "/v1/audit?target=t%00" + MARK, {}, "target", "control characters"),
    ("operator", "/v1/watch?since=" + big(5000), {}, "since", "revision"),
    ("operator", "/v1/watch", {"Last-Event-ID": big(5000)}, "Last-Event-ID", "revision"),
]  # fmt: skip


def assert_refused(r: Any, field: str, limit: str) -> None:
    assert r.status_code == 422, (field, r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["retryable"] is False
    assert field in error["message"] and limit in error["message"], (field, limit, error["message"])
    assert len(r.content) < 2000 and ECHO not in r.text, ("the answer echoes the input", r.text[:300])


async def test_every_field_of_every_body_is_bounded_and_refused_without_an_echo(
    store: dict[str, Any],
) -> None:
    """A 20 MB ``agent_class`` was refused 422 with the 20 MB echoed back (issue 11, point 2), and
    on PostgreSQL a NUL in a text field that reached the store answered 503 (retry) or 500."""
    async with full_plane(store, max_body_bytes=2 << 20) as (client, stores):
        for role, method, path, body, field, limit, action in BODIES:
            r = await client.request(method, path, json=body, headers=bearer(role))
            assert_refused(r, field, limit)
            if action is not None:
                records = [rec for rec in await stores.audit.records() if rec.action == action]
                assert records and records[-1].outcome == "refused", (action, records)
                assert field in records[-1].reason and ECHO not in records[-1].reason
        assert await stores.runs.list(10) == [] and await stores.intents.list() == []
        assert await stores.registry.all_stops() == []
        await assert_bounded_audit(stores)


async def test_every_path_and_query_parameter_is_bounded_and_refused_without_an_echo(
    store: dict[str, Any],
) -> None:
    """An id in a path was echoed in its 404 and audited whole; the query's echoed its value."""
    async with full_plane(store) as (client, stores):
        for role, path, headers, field, limit in PARAMETERS:
            async with client.stream("GET", path, headers={**bearer(role), **headers}) as r:
                await r.aread()
                assert_refused(r, field, limit)
        for path in ("/v1/runs/" + big(1000) + "/end", "/v1/stops/" + big(1000) + "/clear"):
            r = await client.post(path, json={"reason": "r"}, headers=bearer("operator"))
            field = "run_id" if path.startswith("/v1/runs") else "stop_id"
            assert_refused(r, field, f"1 to {MAX_ID_CHARS}")
        refused = [rec for rec in await stores.audit.records() if rec.outcome == "refused"]
        assert {rec.action for rec in refused} == {"run.end", "stop.clear"}
        await assert_bounded_audit(stores)


async def assert_bounded_audit(stores: Any) -> None:
    for record in await stores.audit.records():
        kept = json.dumps(record.detail) + record.reason + record.target
        assert len(kept) < AUDIT_RECORD_MAX and MARK * 200 not in kept, (record.action, len(kept))


async def test_values_at_the_limits_are_accepted(tmp_path: Path) -> None:
    """The limits refuse only what is past them."""
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "c.db")}) as (client, _):
        run_id, tool = "r" * MAX_ID_CHARS, "t" * MAX_NAME_CHARS
        body = {"run_id": run_id, "tools": [tool] * MAX_ITEMS}
        r = await client.post("/v1/runs", json=body, headers=bearer("agent"))
        assert r.status_code == 201 and r.json()["run"]["tools"] == [tool] * MAX_ITEMS, r.text[:300]
        r = await client.get(f"/v1/runs/{run_id}", headers=bearer("agent"))
        assert r.status_code == 200, r.text[:300]
        names = {k: "n" * MAX_NAME_CHARS for k in ("agent", "tenant", "version", "tool")}
        r = await client.post(
            "/v1/intents", json=intent(**names, idempotency_key="k" * 256), headers=bearer("gateway")
        )
        assert r.status_code == 201, r.text[:300]
        reason = "line one\n\tand " + "r" * (MAX_REASON_CHARS - 14)
        r = await client.post(
            "/v1/stops", json={"scope": "tool:x", "reason": reason}, headers=bearer("operator")
        )
        assert r.status_code == 201 and r.json()["reason"] == reason, r.text[:300]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"scope": "tool:" + "t" * 1_000_000, "reason": "r"}, "at most 512 characters"),
        ({"scope": "agent:a\x00b", "reason": "r"}, "control characters"),
        ({"scope": "agent:a1", "reason": "r" * 5_000_000}, f"at most {MAX_REASON_CHARS} characters"),
        ({"scope": "agent:a1", "reason": "nul\x00here"}, "control characters"),
    ],
)
async def test_a_stop_with_a_huge_or_unprintable_field_is_refused_and_audited_in_brief(
    tmp_path: Path, body: dict[str, str], problem: str
) -> None:
    # Past the body limit too: the field's own limit is what refuses it.
    registry = {"backend": "sqlite", "path": str(tmp_path / "control.db")}
    limits = {"max_body_bytes": 16 << 20, "max_intent_body_bytes": 16 << 20}
    async with full_plane(registry, **limits) as (client, stores):
        r = await client.post("/v1/stops", json=body, headers=bearer("operator"))
        assert r.status_code == 422 and problem in r.json()["error"]["message"], r.text[:300]
        assert len(r.content) < 2_000, "the answer does not echo the input"
        records = await stores.audit.records()
        refused = [rec for rec in records if rec.outcome == "refused"]
        assert refused and all(
            len(rec.reason) <= MAX_AUDIT_TEXT and len(rec.target) <= MAX_AUDIT_TEXT for rec in refused
        )
        assert await stores.registry.all_stops() == []


async def test_clearing_with_an_unfit_reason_is_a_422_not_a_500(tmp_path: Path) -> None:
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "control.db")}) as (client, _):
        stop = (
            await client.post(
                "/v1/stops", json={"scope": "agent:a1", "reason": "r"}, headers=bearer("operator")
            )
        ).json()
        for reason in ("   ", "bad\x00reason"):
            r = await client.post(
                f"/v1/stops/{stop['stop_id']}/clear", json={"reason": reason}, headers=bearer("operator")
            )
            assert r.status_code == 422, r.text
