"""The ``IntentStore`` contract, for SQLite (a temporary file) and PostgreSQL (a real server).

Every test runs against both backends. PostgreSQL uses a unique schema, dropped afterwards.
"Another executor" or "after a crash" is a second store instance opened on the same
database: its own connection, as a second process would have.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from haltwire.intents import (
    Created,
    IdempotencyConflict,
    Intent,
    IntentStateError,
    LimitReached,
    UnknownIntent,
    new_intent,
    new_intent_id,
)
from haltwire.scope import Scope
from haltwire.store.intents import IntentStore
from haltwire.store.intents.postgres import PostgresIntentStore
from haltwire.store.intents.sqlite import SqliteIntentStore
from haltwire.store.registry import RegistryUnavailable
from haltwire.store.registry.sqlite import SqliteRegistry
from haltwire.store.runs import RunRecord
from haltwire.store.runs.sqlite import SqliteRunStore
from harness import drop_schema, postgres_url, service_missing

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0
Opener = Callable[[], Awaitable[IntentStore]]


class Backend:
    """The store under test, and a way to open more instances on the same database."""

    def __init__(self, open_store: Opener) -> None:
        self._open = open_store
        self._opened: list[IntentStore] = []
        self.store: IntentStore

    async def open(self) -> IntentStore:
        store = await self._open()
        self._opened.append(store)
        return store

    async def aclose(self) -> None:
        for store in self._opened:
            await store.aclose()


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        b = Backend(lambda: SqliteIntentStore.open(tmp_path / "control.db"))
        b.store = await b.open()
        yield b
        await b.aclose()
        return
    schema = f"test_intents_{uuid.uuid4().hex[:12]}"
    b = Backend(lambda: PostgresIntentStore.open(postgres_url(), schema=schema))
    try:
        b.store = await b.open()
    except RegistryUnavailable:
        service_missing("PostgreSQL")
    try:
        yield b
    finally:
        await b.aclose()
        drop_schema(schema)


@pytest.fixture
def intents(backend: Backend) -> IntentStore:
    return backend.store


async def create(store: IntentStore, key: str, at: float = NOW, **fields: Any) -> Created:
    base: dict[str, Any] = {
        "run_id": "r1",
        "agent": "a1",
        "tenant": "acme",
        "version": "2.1",
        "tool": "refund",
        "arguments": {"order": key, "amount": 120.5, "notes": ["x", {"y": None}]},
        "idempotency_key": key,
        "now": at,
        "needs_approval": False,
    }
    return await store.create(new_intent(**{**base, **fields}))


async def pending(store: IntentStore, key: str, at: float = NOW, **fields: Any) -> Intent:
    made = await create(store, key, at, **fields)
    assert made.created
    return made.intent


async def test_create_round_trips_every_field(intents: IntentStore) -> None:
    made = await create(intents, "k1", arguments={"b": 2, "a": [1, {"z": "é"}]})
    assert made.created
    i = made.intent
    assert i.intent_id.startswith("int_") and len(i.intent_id) == 20
    assert (i.run_id, i.agent, i.tenant, i.version, i.tool) == ("r1", "a1", "acme", "2.1", "refund")
    assert i.arguments == {"a": [1, {"z": "é"}], "b": 2}
    assert (i.idempotency_key, i.state, i.created_at, i.updated_at) == ("k1", "pending", NOW, NOW)
    assert not i.needs_approval and not i.terminal
    assert (i.claimed_by, i.claimed_at, i.outcome, i.error, i.stop_id, i.decided_by) == (None,) * 6
    assert await intents.get(i.intent_id) == i
    assert await intents.by_key("a1", "k1") == i
    assert await intents.get("int_0000000000000000") is None
    assert await intents.by_key("a2", "k1") is None
    approval = await pending(intents, "k2", needs_approval=True, run_id=None)
    assert approval.state == "awaiting_approval" and approval.needs_approval and approval.run_id is None
    assert await intents.get(approval.intent_id) == approval


async def test_the_same_key_and_arguments_return_the_first_intent(intents: IntentStore) -> None:
    first = await pending(intents, "k1", arguments={"order": "o1", "amount": 10})
    # The same call, its keys in another order and at a later time: the recorded intent.
    again = await create(intents, "k1", NOW + 60, arguments={"amount": 10, "order": "o1"}, run_id="r2")
    assert again == Created(first, False)
    assert len(await intents.list()) == 1


async def test_the_same_key_with_other_arguments_or_tool_is_a_conflict(intents: IntentStore) -> None:
    first = await pending(intents, "k1", arguments={"order": "o1", "amount": 10})
    with pytest.raises(IdempotencyConflict, match="'k1'"):
        await create(intents, "k1", arguments={"order": "o1", "amount": 11})
    with pytest.raises(IdempotencyConflict, match="'k1'"):
        await create(intents, "k1", arguments={"order": "o1", "amount": 10}, tool="refund_v2")
    assert await intents.list() == [first]


async def test_the_same_key_of_another_agent_is_another_intent(intents: IntentStore) -> None:
    mine = await pending(intents, "k1", arguments={"order": "o1"})
    theirs = await create(intents, "k1", agent="a2", arguments={"order": "o9"})
    assert theirs.created and theirs.intent.intent_id != mine.intent_id
    assert await intents.by_key("a2", "k1") == theirs.intent
    assert await intents.by_key("a1", "k1") == mine


async def test_concurrent_creates_with_one_key_record_one_intent(backend: Backend) -> None:
    other = await backend.open()
    results: list[Created] = []

    async def make(store: IntentStore) -> None:
        results.append(await create(store, "k1"))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(make, backend.store if i % 2 else other)
    assert sum(r.created for r in results) == 1
    assert len({r.intent.intent_id for r in results}) == 1
    assert len(await backend.store.list()) == 1


async def test_arguments_must_be_a_json_object(intents: IntentStore) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        await create(intents, "k1", arguments=["not", "an", "object"])
    with pytest.raises(ValueError):
        await create(intents, "k1", arguments={"amount": float("nan")})
    with pytest.raises(ValueError, match="idempotency_key"):
        await create(intents, "")
    assert await intents.list() == []


async def test_list_filters_by_run_and_state_oldest_first(intents: IntentStore) -> None:
    a = await pending(intents, "k1", NOW + 3)
    b = await pending(intents, "k2", NOW + 1, run_id="r2")
    c = await pending(intents, "k3", NOW + 2, needs_approval=True)
    assert await intents.list() == [b, c, a]
    assert await intents.list(limit=2) == [b, c]
    assert await intents.list(run_id="r1") == [c, a]
    assert await intents.list(states=["awaiting_approval"]) == [c]
    assert await intents.list(run_id="r1", states={"pending"}) == [a]
    assert await intents.list(states=[]) == []
    with pytest.raises(ValueError, match="bogus"):
        await intents.list(states=["bogus"])


async def test_claim_commit_and_fail(intents: IntentStore) -> None:
    one = await pending(intents, "k1", NOW + 1)
    two = await pending(intents, "k2", NOW + 2)
    claimed = await intents.claim_next("ex1", NOW + 10)
    assert claimed is not None and claimed.intent_id == one.intent_id  # the oldest first
    assert (claimed.state, claimed.claimed_by, claimed.claimed_at, claimed.updated_at) == (
        "claimed",
        "ex1",
        NOW + 10,
        NOW + 10,
    )
    committed = await intents.commit(one.intent_id, "ex1", {"refund": "re_1", "amount": 120.5}, NOW + 11)
    assert committed.state == "committed" and committed.terminal
    assert committed.outcome == {"refund": "re_1", "amount": 120.5} and committed.updated_at == NOW + 11
    assert await intents.get(one.intent_id) == committed
    second = await intents.claim_next("ex1", NOW + 12)
    assert second is not None and second.intent_id == two.intent_id
    failed = await intents.fail(two.intent_id, "ex1", "upstream said 402", NOW + 13)
    assert (failed.state, failed.error, failed.outcome) == ("failed", "upstream said 402", None)
    assert await intents.get(two.intent_id) == failed
    assert await intents.claim_next("ex1", NOW + 14) is None  # nothing pending is left


async def test_claim_next_skips_what_awaits_approval(intents: IntentStore) -> None:
    waiting = await pending(intents, "k1", NOW + 1, needs_approval=True)
    assert await intents.claim_next("ex1", NOW + 2) is None
    approved = await intents.approve(waiting.intent_id, "op-alice", NOW + 3)
    assert (approved.state, approved.decided_by, approved.updated_at) == ("pending", "op-alice", NOW + 3)
    claimed = await intents.claim_next("ex1", NOW + 4)
    assert claimed is not None and claimed.intent_id == waiting.intent_id


async def test_reject_records_who_and_why(intents: IntentStore) -> None:
    waiting = await pending(intents, "k1", needs_approval=True)
    with pytest.raises(ValueError, match="reason"):
        await intents.reject(waiting.intent_id, "op-bob", " ", NOW + 1)
    rejected = await intents.reject(waiting.intent_id, "op-bob", "refund exceeds policy", NOW + 1)
    assert (rejected.state, rejected.decided_by, rejected.decision_reason) == (
        "rejected",
        "op-bob",
        "refund exceeds policy",
    )
    assert rejected.terminal and await intents.get(waiting.intent_id) == rejected
    with pytest.raises(IntentStateError, match="rejected"):
        await intents.approve(waiting.intent_id, "op-alice", NOW + 2)


async def refused(attempt: Awaitable[Intent], intent_id: str, state: str, action: str) -> None:
    with pytest.raises(IntentStateError) as info:
        await attempt
    message = str(info.value)
    assert intent_id in message and f"is {state}" in message and action in message, message


async def test_refused_transitions_name_the_intent_its_state_and_the_action(intents: IntentStore) -> None:
    p = await pending(intents, "k1", NOW + 1)
    w = await pending(intents, "k2", NOW + 2, needs_approval=True)
    await refused(intents.commit(p.intent_id, "ex1", {}, NOW), p.intent_id, "pending", "commit")
    await refused(intents.fail(p.intent_id, "ex1", "x", NOW), p.intent_id, "pending", "fail")
    await refused(intents.approve(p.intent_id, "op", NOW), p.intent_id, "pending", "approve")
    await refused(intents.reject(p.intent_id, "op", "no", NOW), p.intent_id, "pending", "reject")
    await refused(intents.commit(w.intent_id, "ex1", {}, NOW), w.intent_id, "awaiting_approval", "commit")
    await refused(intents.fail(w.intent_id, "ex1", "x", NOW), w.intent_id, "awaiting_approval", "fail")
    assert await intents.get(p.intent_id) == p and await intents.get(w.intent_id) == w
    claimed = await intents.claim_next("ex1", NOW + 3)
    assert claimed is not None and claimed.intent_id == p.intent_id
    await refused(intents.approve(p.intent_id, "op", NOW), p.intent_id, "claimed", "approve")
    await refused(intents.reject(p.intent_id, "op", "no", NOW), p.intent_id, "claimed", "reject")
    # Only the claiming executor commits or fails it.
    with pytest.raises(IntentStateError, match=r"ex1.*ex2"):
        await intents.commit(p.intent_id, "ex2", {}, NOW + 4)
    with pytest.raises(IntentStateError, match=r"ex1.*ex2"):
        await intents.fail(p.intent_id, "ex2", "x", NOW + 4)
    assert await intents.get(p.intent_id) == claimed  # refusals change nothing
    done = await intents.commit(p.intent_id, "ex1", {"ok": True}, NOW + 5)
    # A terminal intent moves no more: no second commit, no fail after commit.
    await refused(
        intents.commit(p.intent_id, "ex1", {"ok": False}, NOW + 6), p.intent_id, "committed", "commit"
    )
    await refused(intents.fail(p.intent_id, "ex1", "late", NOW + 6), p.intent_id, "committed", "fail")
    assert await intents.get(p.intent_id) == done
    with pytest.raises(UnknownIntent):
        await intents.commit("int_0000000000000000", "ex1", {}, NOW)
    with pytest.raises(UnknownIntent):
        await intents.approve("int_0000000000000000", "op", NOW)


async def test_concurrent_claims_take_each_intent_exactly_once(backend: Backend) -> None:
    # Ten claimers over five pending intents, split across two store instances (two
    # connections, as two executor processes would have).
    other = await backend.open()
    ids = {(await pending(backend.store, f"k{i}", NOW + i)).intent_id for i in range(5)}
    claims: list[tuple[str, Intent | None]] = []

    async def claim(store: IntentStore, executor: str) -> None:
        claims.append((executor, await store.claim_next(executor, NOW + 100)))

    async with anyio.create_task_group() as tg:
        for n in range(10):
            tg.start_soon(claim, backend.store if n % 2 else other, f"ex{n}")
    taken = [(ex, i) for ex, i in claims if i is not None]
    assert sorted(i.intent_id for _, i in taken) == sorted(ids)  # each exactly once
    assert sum(1 for _, i in claims if i is None) == 5
    for executor, intent in taken:
        stored = await backend.store.get(intent.intent_id)
        assert stored is not None and (stored.state, stored.claimed_by) == ("claimed", executor)


async def test_after_a_crash_claimed_intents_become_unknown_and_are_resolved(backend: Backend) -> None:
    store = backend.store
    a = await pending(store, "k1", NOW + 1)
    b = await pending(store, "k2", NOW + 2)
    c = await pending(store, "k3", NOW + 3)
    assert (await store.claim_next("ex1", NOW + 10)) is not None
    assert (await store.claim_next("ex1", NOW + 11)) is not None
    assert (await store.claim_next("ex2", NOW + 12)) is not None  # c, another executor's
    await store.aclose()  # the executor "crashes" with a and b claimed
    restarted = await backend.open()
    unknown = await restarted.mark_unknown("ex1", NOW + 20)
    assert [i.intent_id for i in unknown] == [a.intent_id, b.intent_id]
    assert all(i.state == "unknown" and i.claimed_by == "ex1" and i.updated_at == NOW + 20 for i in unknown)
    other = await restarted.get(c.intent_id)
    assert other is not None and other.state == "claimed"  # ex2's claim is left alone
    assert await restarted.mark_unknown("ex1", NOW + 21) == []
    assert await restarted.claim_next("ex1", NOW + 22) is None  # unknown is never claimed again
    # a had passed its final check before the crash (its call may have been made), b had not.
    await restarted.check(a.intent_id, "ex1", 5, NOW + 22)
    # A stop cancels what was never checked (b, and c, claimed by ex2), not what may have happened.
    cancelled = await restarted.cancel_for_stop(Scope("global"), "stp_1", NOW + 22)
    assert sorted(i.intent_id for i in cancelled) == sorted([b.intent_id, c.intent_id])
    with pytest.raises(IntentStateError, match=r"ex1.*ex2"):
        await restarted.commit(a.intent_id, "ex2", {}, NOW + 23)
    # Re-issued with the same idempotency key, the upstream answers; the intent is resolved.
    resolved = await restarted.commit(a.intent_id, "ex1", {"refund": "re_1"}, NOW + 24)
    assert (resolved.state, resolved.outcome) == ("committed", {"refund": "re_1"})
    with pytest.raises(IntentStateError, match="is cancelled"):
        await restarted.fail(b.intent_id, "ex1", "upstream: no such refund", NOW + 25)


async def test_a_stop_cancels_matching_intents_whose_call_was_not_made(backend: Backend) -> None:
    scopes = [
        Scope("run", "r1"),
        Scope("tenant", "acme"),
        Scope("tool", "refund"),
        Scope("agent", "a1"),
        Scope("version", "a1@2.1"),
        Scope("global"),
    ]
    for n, scope in enumerate(scopes):
        store = await backend.open()
        # Two intents per field that differ from the matching ones in exactly that field.
        made = [
            await pending(store, f"{n}-match", NOW + 1),
            await pending(store, f"{n}-waiting", NOW + 2, needs_approval=True),
            await pending(store, f"{n}-run", NOW + 3, run_id="r2"),
            await pending(store, f"{n}-norun", NOW + 4, run_id=None),
            await pending(store, f"{n}-tenant", NOW + 5, tenant="globex"),
            await pending(store, f"{n}-tool", NOW + 6, tool="lookup_order"),
            await pending(store, f"{n}-agent", NOW + 7, agent="a2"),
            await pending(store, f"{n}-version", NOW + 8, version="2.2"),
            await pending(store, f"{n}-unchecked", NOW + 0.6),
            await pending(store, f"{n}-checked", NOW + 0.5),
        ]
        checked = await store.claim_next(f"ex{n}", NOW + 9)
        assert checked is not None and checked.intent_id == made[-1].intent_id
        await store.check(checked.intent_id, f"ex{n}", 1, NOW + 9)  # its call may be made: left alone
        unchecked = await store.claim_next(f"ex{n}", NOW + 9)  # claimed, never checked: cancelled
        assert unchecked is not None and unchecked.intent_id == made[-2].intent_id
        cancelled = await store.cancel_for_stop(scope, f"stp_{n}", NOW + 10)
        expected = sorted((i for i in made[:-1] if scope in i.scopes), key=lambda i: i.created_at)
        expected_ids = [i.intent_id for i in expected]
        assert [i.intent_id for i in cancelled] == expected_ids, scope
        assert made[0].intent_id in expected_ids and made[1].intent_id in expected_ids
        assert made[-2].intent_id in expected_ids
        for intent in made:
            stored = await store.get(intent.intent_id)
            assert stored is not None
            if intent.intent_id in expected_ids:
                assert (stored.state, stored.stop_id, stored.updated_at) == (
                    "cancelled",
                    f"stp_{n}",
                    NOW + 10,
                )
            else:
                assert stored.stop_id is None and stored.state == (
                    "claimed" if intent is made[-1] else intent.state
                )
        # A cancelled intent is terminal: nothing approves or cancels it again.
        with pytest.raises(IntentStateError, match="is cancelled"):
            await store.approve(made[1].intent_id, "op", NOW + 11)
        assert await store.cancel_for_stop(scope, f"stp_{n}b", NOW + 12) == []
        await store.cancel_for_stop(Scope("global"), "cleanup", NOW + 13)  # the next round starts clean
        assert await store.list(states=["pending", "awaiting_approval"]) == []


async def test_the_scope_matching_is_per_kind_not_per_value(intents: IntentStore) -> None:
    # A run id equal to a tool's name must not make a tool stop cancel that run.
    odd = await pending(intents, "k1", run_id="refund", tool="lookup_order")
    assert await intents.cancel_for_stop(Scope("tool", "refund"), "stp_1", NOW + 1) == []
    assert [i.intent_id for i in await intents.cancel_for_stop(Scope("run", "refund"), "stp_2", NOW + 2)] == [
        odd.intent_id
    ]


async def test_intents_share_the_registry_file(tmp_path: Path) -> None:
    db = tmp_path / "control.db"
    registry = await SqliteRegistry.open(db)
    runs = await SqliteRunStore.open(db)
    intents = await SqliteIntentStore.open(db)
    try:
        stop = await registry.issue_stop("run:r1", "runaway", "op", now=NOW)
        await runs.register(RunRecord("r1", "a1", "acme", "2.1", ("refund",), "default", "agent-1", NOW))
        intent = await pending(intents, "k1")
        cancelled = await intents.cancel_for_stop(Scope.parse(stop.scope), stop.stop_id, NOW + 1)
        assert [i.intent_id for i in cancelled] == [intent.intent_id]
        assert cancelled[0].stop_id == stop.stop_id and await registry.revision() == 1
    finally:
        await intents.aclose()
        await runs.aclose()
        await registry.aclose()


async def test_generated_intent_ids_are_distinct_and_valid() -> None:
    ids = {new_intent_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("int_") and len(i) == 20 and int(i[4:], 16) >= 0 for i in ids)


async def test_a_closed_store_and_an_unreachable_server_are_unavailable(backend: Backend) -> None:
    store = await backend.open()
    await store.aclose()
    with pytest.raises(RegistryUnavailable):
        await store.get("int_0000000000000000")
    with pytest.raises(RegistryUnavailable):
        await store.claim_next("ex1", NOW)
    with pytest.raises(RegistryUnavailable):
        await create(store, "k1")
    with pytest.raises(RegistryUnavailable):
        await PostgresIntentStore.open("postgresql://postgres@127.0.0.1:1/test", connect_timeout=1)


async def test_a_stop_racing_claims_and_checks_cancels_every_intent_not_checked(backend: Backend) -> None:
    executor = await backend.open()  # the executor's own connection; the stop comes on another
    ids = {(await pending(backend.store, f"k{i}", NOW + i)).intent_id for i in range(20)}
    claimed: list[Intent] = []
    cancelled: list[Intent] = []

    checked: list[str] = []

    async def claim_and_check_all() -> None:
        while (intent := await executor.claim_next("ex1", NOW + 100)) is not None:
            claimed.append(intent)
            try:  # the executor's final check, as soon as it has claimed
                await executor.check(intent.intent_id, "ex1", 1, NOW + 100)
                checked.append(intent.intent_id)
            except IntentStateError:  # the stop cancelled it between the claim and the check
                pass

    async def stop() -> None:
        while len(claimed) < 2:  # the stop lands while the executor is claiming and checking
            await anyio.sleep(0.001)
        cancelled.extend(await backend.store.cancel_for_stop(Scope("run", "r1"), "stp_1", NOW + 100))

    async with anyio.create_task_group() as tg:
        tg.start_soon(claim_and_check_all)
        tg.start_soon(stop)
    assert len(claimed) >= 2 and checked
    # Every intent is either checked (its call may be made) or cancelled by the stop, never both.
    assert set(checked) | {i.intent_id for i in cancelled} == ids
    assert not set(checked) & {i.intent_id for i in cancelled}
    for intent in await backend.store.list():
        if intent.intent_id in checked:
            assert (intent.state, intent.stop_id, intent.checked_revision) == ("claimed", None, 1)
        else:
            assert (intent.state, intent.stop_id, intent.checked_revision) == ("cancelled", "stp_1", None)


async def test_the_final_check_records_its_revision_once_and_blocks_cancelling(intents: IntentStore) -> None:
    first = await pending(intents, "k1")
    claimed = await intents.claim_next("ex1", NOW + 1)
    assert claimed is not None and claimed.checked_revision is None
    with pytest.raises(IntentStateError, match="executor 'ex2' cannot check"):
        await intents.check(first.intent_id, "ex2", 7, NOW + 2)
    checked = await intents.check(first.intent_id, "ex1", 7, NOW + 2)
    assert (checked.state, checked.checked_revision, checked.updated_at) == ("claimed", 7, NOW + 2)
    # A repeated check answers the first (a restarted executor asks again): revision 7, not 9.
    again = await intents.check(first.intent_id, "ex1", 9, NOW + 3)
    assert again.checked_revision == 7 and await intents.get(first.intent_id) == checked
    with pytest.raises(IntentStateError, match="passed its final check at revision 7"):
        await intents.cancel_claimed(first.intent_id, "ex1", "stp_x", NOW + 4)
    # It survives a restart's mark (unknown keeps the revision) and settles as committed.
    (unknown,) = await intents.mark_unknown("ex1", NOW + 5)
    assert (unknown.state, unknown.checked_revision) == ("unknown", 7)
    assert (await intents.commit(first.intent_id, "ex1", {"ok": 1}, NOW + 6)).state == "committed"
    with pytest.raises(IntentStateError, match="is committed: cannot check"):
        await intents.check(first.intent_id, "ex1", 9, NOW + 7)


async def test_a_claimed_intent_never_checked_is_cancelled_by_its_executor(intents: IntentStore) -> None:
    intent = await pending(intents, "k1")
    await intents.claim_next("ex1", NOW + 1)
    with pytest.raises(IntentStateError, match="executor 'ex2' cannot cancel"):
        await intents.cancel_claimed(intent.intent_id, "ex2", "stp_x", NOW + 2)
    cancelled = await intents.cancel_claimed(intent.intent_id, "ex1", "stp_x", NOW + 2)
    assert (cancelled.state, cancelled.stop_id, cancelled.checked_revision) == ("cancelled", "stp_x", None)
    with pytest.raises(IntentStateError, match="is cancelled: cannot cancel"):
        await intents.cancel_claimed(intent.intent_id, "ex1", "stp_x", NOW + 3)


async def test_the_per_run_limit_counts_checked_intents_of_the_run_and_tool(backend: Backend) -> None:
    """Six concurrent checks under a limit of 3, over two connections: exactly 3 pass."""
    store, other = backend.store, await backend.open()
    ids = [(await pending(store, f"k{n}", NOW + n)).intent_id for n in range(6)]
    for _ in range(6):
        await store.claim_next("ex1", NOW + 10)
    elsewhere = await pending(store, "other-run", NOW + 20, run_id="r2")
    await store.claim_next("ex1", NOW + 21)
    outcomes: list[str] = []

    async def check(s: IntentStore, intent_id: str) -> None:
        try:
            await s.check(intent_id, "ex1", 1, NOW + 30, limit=3)
            outcomes.append("checked")
        except LimitReached as exc:
            assert (exc.run_id, exc.tool, exc.limit) == ("r1", "refund", 3)
            outcomes.append("limit")

    async with anyio.create_task_group() as tg:
        for n, intent_id in enumerate(ids):
            tg.start_soon(check, store if n % 2 else other, intent_id)
    assert sorted(outcomes) == ["checked"] * 3 + ["limit"] * 3
    # Another run is counted apart; no limit, no count.
    assert (await store.check(elsewhere.intent_id, "ex1", 1, NOW + 31, limit=3)).checked_revision == 1
    refused = [i for i in ids if (await store.get(i)).checked_revision is None]  # type: ignore[union-attr]
    assert len(refused) == 3
    assert (await store.check(refused[0], "ex1", 2, NOW + 32)).checked_revision == 2
