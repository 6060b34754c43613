"""Bounded inputs at the control plane: what a hostile caller sends is refused, and what the
append-only audit log keeps of it is bounded too."""

from __future__ import annotations

from pathlib import Path

import pytest

from haltwire.control.plane import MAX_AUDIT_TEXT, excerpt
from haltwire.limits import MAX_REASON_CHARS, MAX_SCOPE_CHARS
from haltwire.scope import Scope, ScopeError
from plane_harness import bearer, full_plane

pytestmark = pytest.mark.anyio


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
        assert r.status_code == 422 and problem in r.json()["error"]["message"], r.text
        assert len(r.content) < 2_000, "the answer does not echo the input"
        records = await stores.audit.records()
        refused = [rec for rec in records if rec.outcome == "refused"]
        assert refused and all(len(rec.reason) <= MAX_AUDIT_TEXT and len(rec.target) <= MAX_AUDIT_TEXT for rec in refused)
        assert await stores.registry.all_stops() == []


async def test_clearing_with_an_unfit_reason_is_a_422_not_a_500(tmp_path: Path) -> None:
    async with full_plane({"backend": "sqlite", "path": str(tmp_path / "control.db")}) as (client, _):
        stop = (await client.post("/v1/stops", json={"scope": "agent:a1", "reason": "r"}, headers=bearer("operator"))).json()
        for reason in ("   ", "bad\x00reason"):
            r = await client.post(f"/v1/stops/{stop['stop_id']}/clear", json={"reason": reason}, headers=bearer("operator"))
            assert r.status_code == 422, r.text
