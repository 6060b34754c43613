"""The stop verdict: one rule (``StopSet.verdict``) that every enforcement point asks.

First the rule itself; then each of its five users (the gateway, the lease desk, the broker, the
executor's final check at the control plane, the downstream credential verifier) is shown to
ask it, with the scopes it must ask about, and to map each answer to its own wire type: a
verdict planted in ``StopSet.verdict`` must come out of all five.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from haltwire.config import ControlLink
from haltwire.control import parse_control_config
from haltwire.control.broker import Broker, BrokerKeys
from haltwire.control.config import AgentClass, Caller
from haltwire.control.errors import Refused
from haltwire.control.intents import check
from haltwire.control.leases import LeaseDesk
from haltwire.control.plane import Plane
from haltwire.control.stores import open_stores
from haltwire.credentials import CredentialClaims, revoked
from haltwire.gateway.stops import stop_refusal
from haltwire.identity import Identity
from haltwire.intents import new_intent
from haltwire.refusal import Refusal
from haltwire.scope import Scope, call_scopes, run_scopes
from haltwire.stops import Fenced, Stopped, StopRecord, StopSet, Verdict
from haltwire.store.runs import RunRecord
from haltwire.tokens import LeaseClaims, LeaseKeys
from haltwire.watch import StopWatch

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0
STOP = StopRecord("stp_1", "tenant:acme", "refund storm", "op", NOW - 5, None, 7)
IDENTITY = Identity(agent="a1", tenant="acme", version="2.1")
RUN = RunRecord("r-1", "a1", "acme", "2.1", (), "default", "agent-1", NOW)


def stopset(*changes: tuple[str, StopRecord]) -> StopSet:
    s = StopSet()
    for kind, stop in changes:
        s.apply(kind, stop, stop.cleared_revision or stop.revision)  # type: ignore[arg-type]
    return s


def scopes(*texts: str) -> frozenset[Scope]:
    return frozenset(Scope.parse(t) for t in texts)


# -- the rule ---------------------------------------------------------------------------------


def test_nothing_active_and_nothing_since_the_grant_builds_no_scopes() -> None:
    def never() -> frozenset[Scope]:
        raise AssertionError("the scopes were built")

    assert StopSet().verdict(never, NOW) is None
    cleared = replace(STOP, cleared_revision=8)
    s = stopset(("stop", STOP), ("clear", cleared))
    assert s.verdict(never, NOW) is None
    assert s.verdict(never, NOW, generation=8) is None


def test_the_broadest_active_stop_wins_and_an_expired_one_is_skipped() -> None:
    s = stopset(
        ("stop", replace(STOP, stop_id="stp_run", scope="run:r-1", revision=1)),
        ("stop", replace(STOP, stop_id="stp_old", scope="global", revision=2, expires_at=NOW - 1)),
        ("stop", replace(STOP, revision=3)),
    )
    verdict = s.verdict(RUN.scopes, NOW)
    assert verdict == Stopped(Scope("tenant", "acme"), replace(STOP, revision=3))
    assert s.verdict(scopes("run:r-2", "agent:a2", "global"), NOW) is None


def test_a_grant_older_than_a_stop_on_its_run_is_fenced_even_after_the_clear() -> None:
    cleared = replace(STOP, cleared_revision=8)
    s = stopset(("stop", STOP), ("clear", cleared))
    assert s.verdict(RUN.scopes, NOW, generation=6) == Fenced(revision=7, generation=6)
    assert s.verdict(RUN.scopes, NOW, generation=7) is None
    assert s.verdict(RUN.scopes, NOW) is None  # no grant: nothing to fence


def test_a_tool_stop_refuses_calls_to_the_tool_and_fences_no_run() -> None:
    tool_stop = replace(STOP, scope="tool:refund", revision=4)
    s = stopset(("stop", tool_stop), ("clear", replace(tool_stop, cleared_revision=5)))
    call = call_scopes(IDENTITY, "refund", "r-1")
    assert s.verdict(call, NOW, generation=1) is None
    s.apply("stop", replace(tool_stop, stop_id="stp_2", revision=6), 6)
    assert s.verdict(call, NOW, generation=1) == Stopped(Scope("tool", "refund"), replace(tool_stop, stop_id="stp_2", revision=6))


# -- its five users ----------------------------------------------------------------------------


class Planted:
    """``StopSet.verdict`` replaced: answers ``verdict`` and records the scopes it was asked about."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verdict: Verdict | None = None
        self.asked: list[tuple[frozenset[Scope], int | None]] = []
        planted = self

        def fake(
            self: StopSet,
            scopes: frozenset[Scope] | Callable[[], frozenset[Scope]],
            now: float,
            generation: int | None = None,
        ) -> Verdict | None:
            planted.asked.append((scopes() if callable(scopes) else scopes, generation))
            return planted.verdict

        monkeypatch.setattr(StopSet, "verdict", fake)


STOPPED = Stopped(Scope("tenant", "acme"), STOP)
FENCED = Fenced(revision=7, generation=3)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Planted]:
    yield Planted(monkeypatch)


def test_the_gateway_asks_about_the_calls_scopes_and_its_leases_generation(planted: Planted) -> None:
    watch = StopWatch(ControlLink(url="http://127.0.0.1:9", token="t"))
    watch.last_heard = time.monotonic()
    lease = LeaseClaims("r-1", "a1", "acme", "2.1", generation=3, issued_at=NOW, expires_at=NOW + 15)
    assert stop_refusal(watch, IDENTITY, "refund", lease) is None
    assert planted.asked == [(call_scopes(IDENTITY, "refund", "r-1"), 3)]
    planted.verdict = STOPPED
    r = stop_refusal(watch, IDENTITY, "refund", None)
    assert isinstance(r, Refusal) and r.code == "stopped" and dict(r.extra)["stop_id"] == "stp_1"
    assert planted.asked[-1] == (call_scopes(IDENTITY, "refund"), None)
    planted.verdict = FENCED
    r = stop_refusal(watch, IDENTITY, "refund", lease)
    assert isinstance(r, Refusal) and r.code == "lease_invalid" and "revision 7" in r.message


def test_the_lease_desk_asks_about_the_runs_scopes(planted: Planted) -> None:
    desk = LeaseDesk(LeaseKeys({"k1": b"k" * 32}, signing="k1"), {"default": AgentClass()}, lambda: NOW)
    assert desk.check(RUN) is None
    planted.verdict = STOPPED
    refused = desk.grant(RUN)
    assert isinstance(refused, Refused) and (refused.status, refused.code) == (409, "stopped")
    assert refused.extra["stop_id"] == "stp_1"
    assert {s for s, _ in planted.asked} == {RUN.scopes}
    assert {g for _, g in planted.asked} == {None}  # a new grant has nothing to fence


def test_the_broker_asks_about_the_runs_scopes(planted: Planted) -> None:
    broker = Broker(BrokerKeys({"b1": Ed25519PrivateKey.generate()}, "b1"), ["orders"], 300, clock=lambda: NOW)
    assert not isinstance(broker.issue(RUN, "orders"), Refused)
    planted.verdict = STOPPED
    refused = broker.issue(RUN, "orders")
    assert isinstance(refused, Refused) and refused.code == "stopped" and refused.extra["scope"] == "tenant:acme"
    assert {s for s, _ in planted.asked} == {RUN.scopes}


def test_the_credential_verifier_asks_about_the_runs_scopes_and_the_credentials_generation(
    planted: Planted,
) -> None:
    claims = CredentialClaims("crd_1", "r-1", "a1", "acme", "2.1", "orders", 3, NOW, NOW + 300, "b1")
    assert revoked(claims, StopSet(), NOW) is None
    assert planted.asked == [(run_scopes("r-1", "a1", "acme", "2.1"), 3)]
    planted.verdict = STOPPED
    assert "stop stp_1" in (revoked(claims, StopSet(), NOW) or "")
    planted.verdict = FENCED
    assert "revision 7" in (revoked(claims, StopSet(), NOW) or "")


async def test_the_executors_final_check_asks_about_the_intents_scopes(planted: Planted, tmp_path: Path) -> None:
    config = parse_control_config({"registry": {"backend": "sqlite", "path": str(tmp_path / "c.db")}})
    plane = Plane(config)
    executor = Caller("executor-1", "executor")
    fields: dict[str, Any] = {
        "agent": "a1",
        "tenant": "acme",
        "version": "2.1",
        "tool": "shop_refund",
        "arguments": {"order": "A-1"},
        "run_id": "r-1",
        "needs_approval": False,
    }
    async with open_stores(config) as stores:
        plane.stores = stores
        first = new_intent(now=NOW, idempotency_key="k-1", **fields)
        second = new_intent(now=NOW + 1, idempotency_key="k-2", **fields)
        for intent in (first, second):
            await stores.intents.create(intent)
        claimed = await stores.intents.claim_next(executor.name, NOW)
        assert claimed is not None and claimed.intent_id == first.intent_id
        passed = await check(plane, executor, first.intent_id)
        assert passed.checked_revision == 0
        planted.verdict = STOPPED
        assert await stores.intents.claim_next(executor.name, NOW) is not None
        with pytest.raises(Refused) as refused:
            await check(plane, executor, second.intent_id)
        assert (refused.value.status, refused.value.code) == (409, "stopped")
        cancelled = await stores.intents.get(second.intent_id)
        assert cancelled is not None and (cancelled.state, cancelled.stop_id) == ("cancelled", "stp_1")
        assert {s for s, _ in planted.asked} == {first.scopes}
