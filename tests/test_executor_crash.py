"""The executor killed with ``kill -9`` at random points: no refund applies twice, nothing is lost.

The control plane and the shop (the side-effect recorder: one ledger row per idempotency key,
``requests`` counting every call with it) run in the test process on real sockets; each
executor is a real OS process from a fork server (``executor_process``), killed with SIGKILL.
The next run's executor is the restart that resolves what the killed one left: it marks the
intents it had claimed ``unknown`` and re-issues the checked ones with their keys.

The random-kill test runs twice over: 20 kills in the default run, and the issue's 100 kills as
the soak variant (``-m soak``). ``HALTWIRE_CRASH_RUNS`` sets the number of kills of both for
local iteration, and ``HALTWIRE_CRASH_SEED`` replays a failing run: the seed is printed, and
noted on any failure.
"""

from __future__ import annotations

import multiprocessing.process
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from control_harness import auth
from executor_harness import control_plane, gateway_config, intents, propose, shop
from executor_process import ExecutorProcesses
from haltwire.control import create_app, parse_control_config
from haltwire.demo.shop import MAX_REFUND_CENTS, ORDERS, Shop
from haltwire.serve import serving
from ports import free_port
from runs_harness import config_dict as control_config
from stops_harness import issue, until

pytestmark = pytest.mark.anyio

#: The default run's kills, and the soak's: the issue's acceptance says 100 runs.
SHORT_RUNS, SOAK_RUNS = 20, 100
TERMINAL = frozenset({"committed", "failed", "cancelled"})
#: Where the kill lands, read from the intents and the ledger once the process is dead.
WINDOWS = (
    "pending",  # not claimed yet
    "claimed, not checked",  # between the claim and the final check
    "checked, call not arrived",  # between the check and the shop receiving the call
    "checked, call in the shop",  # the shop got the call, had not applied it yet
    "applied, not committed",  # the dangerous one: the shop applied it, the control plane does not know
)


@dataclass(frozen=True)
class Proposed:
    intent_id: str
    key: str
    run: int
    order_id: str
    cents: int

    @property
    def valid(self) -> bool:
        return self.cents <= MAX_REFUND_CENTS


def seed() -> int:
    given = os.environ.get("HALTWIRE_CRASH_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


async def ledger(s: Shop) -> dict[str, Any]:
    # In a thread: the shop's ledger lock may be held by an fsync of its own.
    return await anyio.to_thread.run_sync(s.ledger)


async def audit_records(cp: str, action: str) -> list[dict[str, Any]]:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.get("/v1/audit", headers=auth("operator"))
    assert r.status_code == 200, r.text
    return [rec for rec in r.json()["records"] if rec["action"] == action]


async def killed(process: multiprocessing.process.BaseProcess) -> None:
    process.kill()  # SIGKILL: no finally block, no cancelled request, no goodbye
    await anyio.to_thread.run_sync(process.join, 10)
    assert process.exitcode == -9, process.exitcode


def classify(state: dict[str, Any], before: set[str], after: set[str], windows: Counter[str]) -> Counter[str]:
    """Count, for one kill, the unsettled intents by where the kill caught them."""
    for intent in state.values():
        key = intent["idempotency_key"]
        if intent["state"] == "pending":
            windows["pending"] += 1
        elif intent["state"] in ("claimed", "unknown"):
            if intent["checked_revision"] is None:
                windows["claimed, not checked"] += 1
            elif key in before:
                windows["applied, not committed"] += 1
            elif key in after:
                windows["checked, call in the shop"] += 1
            else:
                windows["checked, call not arrived"] += 1
    return windows


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "runs",
    [
        pytest.param(SHORT_RUNS, id=f"{SHORT_RUNS}-kills"),
        pytest.param(SOAK_RUNS, id=f"{SOAK_RUNS}-kills", marks=pytest.mark.soak),
    ],
)
async def test_kill_9_at_random_points_never_applies_a_key_twice_and_settles_every_intent(
    tmp_path: Path, runs: int
) -> None:
    """``runs`` executors killed at random points, each next one the restart. The soak variant
    (``-m soak``) is the issue's 100 kills; the default run's 20 check the same properties and
    that kills landed in the dangerous windows."""
    runs = int(os.environ.get("HALTWIRE_CRASH_RUNS", runs))
    chosen = seed()
    print(f"\ncrash test: {runs} runs, seed {chosen} (HALTWIRE_CRASH_SEED={chosen} replays it)")
    try:
        await crash_runs(tmp_path, random.Random(chosen), runs)
    except BaseException as exc:
        exc.add_note(f"crash test seed {chosen}: rerun with HALTWIRE_CRASH_SEED={chosen}")
        raise


async def crash_runs(tmp_path: Path, rng: random.Random, runs: int) -> None:
    began = time.perf_counter()
    processes = ExecutorProcesses()
    proposed: dict[str, Proposed] = {}
    stopped_runs: set[int] = set()
    windows: Counter[str] = Counter()
    starts: list[float] = []
    s = Shop(tmp_path / "ledger.db", delay_s=rng.uniform(0.02, 0.05))
    try:
        async with control_plane(tmp_path / "control.db") as cp, serving(s.http_app()) as up:
            config = gateway_config(up, cp)

            # Past ``runs``, while the dangerous windows have not been hit (a loaded machine moves
            # the moments), every kill is aimed, up to ``runs`` more.
            hits = _hits_needed(runs)
            run = 0
            while run < runs or (run < 2 * runs and not _dangerous_windows_hit(windows, hits)):
                for n in range(rng.randint(1, 4)):
                    order = rng.choice(list(ORDERS.values()))
                    cents = rng.randint(1, order.amount_cents)
                    if rng.random() < 0.1:  # over the $200 cap: the shop refuses, the intent fails
                        cents = rng.randint(MAX_REFUND_CENTS + 1, 50_000)
                    key = f"refund-{run}-{n}"
                    intent = await propose(cp, key, order.order_id, cents, run=f"crash-{run}")
                    proposed[key] = Proposed(intent["intent_id"], key, run, order.order_id, cents)
                kill_after = rng.uniform(0.1, 0.6)
                # One kill in three is aimed: just after a check passed, within the shop's call
                # or just past it, where a restart without the key would refund twice.
                aimed = run >= runs or rng.random() < 0.33
                aim = rng.uniform(0.0, s.delay_s + 0.03) if aimed else None
                stop_after = rng.uniform(0.0, kill_after) if rng.random() < 0.12 else None

                clock = time.perf_counter()
                process = await anyio.to_thread.run_sync(processes.start, config)
                starts.append(time.perf_counter() - clock)
                async with anyio.create_task_group() as tg:
                    if stop_after is not None:
                        stopped_runs.add(run)
                        tg.start_soon(stop_later, cp, f"run:crash-{run}", stop_after)
                    if aim is None:
                        await anyio.sleep(kill_after)
                    else:
                        with anyio.move_on_after(kill_after + 1.0):
                            await a_check_passed(cp)
                        await anyio.sleep(aim)
                await killed(process)

                before = {r["idempotency_key"] for r in (await ledger(s))["refunds"]}
                state = await intents(cp)
                await anyio.sleep(s.delay_s + 0.02)  # a call the shop had received lands now
                after = {r["idempotency_key"] for r in (await ledger(s))["refunds"]}
                classify(state, before, after, windows)
                run += 1
            kills = run
            killing_s = time.perf_counter() - began

            # The last restart runs until everything is settled, unkilled.
            final = await anyio.to_thread.run_sync(processes.start, config)

            async def all_settled() -> bool:
                return all(i["state"] in TERMINAL for i in (await intents(cp)).values())

            await until(all_settled, 60)
            await killed(final)

            settled = await intents(cp)
            refunds = (await ledger(s))["refunds"]
            unknown_audits = await audit_records(cp, "intent.unknown")
    finally:
        s.close()

    # Every intent ends committed, failed or cancelled, and for the reason it should.
    assert set(settled) == set(proposed)
    states = Counter(i["state"] for i in settled.values())
    assert set(states) <= TERMINAL, states
    for key, p in proposed.items():
        got = settled[key]["state"]
        if got == "cancelled":
            assert p.run in stopped_runs, f"{key} cancelled without a stop on its run"
        else:
            assert got == ("committed" if p.valid else "failed"), (key, got, p)

    # The side effects: a committed intent applied exactly once with its own arguments, the
    # others not at all, and nothing else applied.
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in refunds:
        rows.setdefault(r["idempotency_key"], []).append(r)
    committed = [k for k, i in settled.items() if i["state"] == "committed"]
    for key in committed:
        p = proposed[key]
        assert [(r["order_id"], r["amount_cents"]) for r in rows.get(key, [])] == [(p.order_id, p.cents)], key
        outcome = settled[key]["outcome"]["structuredContent"]
        assert outcome["refund_id"] == rows[key][0]["refund_id"], key
    for key in set(settled) - set(committed):
        assert key not in rows, f"{key} is {settled[key]['state']} but the shop applied it"
    assert len(refunds) == len(rows) == len(committed)

    # Restarts really marked intents unknown, and some of those were committed after all.
    went_unknown = {i for rec in unknown_audits for i in rec["detail"]["intents"]}
    by_id = {i["intent_id"]: i for i in settled.values()}
    # Each start asks once, before anything else (a kill may land before even that).
    assert 1 <= len(unknown_audits) <= kills + 1
    resolved = Counter(by_id[i]["state"] for i in went_unknown)
    reissued = sum(r["requests"] > 1 for r in refunds)

    total_s = time.perf_counter() - began
    print(f"  intents: {dict(states)}; stopped runs: {len(stopped_runs)}")
    print(f"  kills caught intents: {dict((w, windows[w]) for w in WINDOWS)}")
    print(
        f"  restarts that marked unknown: {len(unknown_audits)} of {kills + 1};"
        f" intents marked: {len(went_unknown)}, since {dict(resolved)}"
    )
    print(f"  ledger rows re-issued with their key after a kill (requests > 1): {reissued}")
    print(
        f"  executor start() {min(starts) * 1000:.0f}..{max(starts) * 1000:.0f} ms"
        f" (first, with the fork server: {starts[0] * 1000:.0f} ms);"
        f" {kills} kills ({runs} asked) in {killing_s:.1f} s, {total_s:.1f} s in all"
    )
    # Not vacuous: kills landed mid-call and in the dangerous window, several times in the soak
    # (20 kills caught 4-12 of each in three trials). (Between the claim and the check
    # is a few microseconds of the executor's time: rarely hit here, test_executor.py covers it
    # directly.)
    assert _dangerous_windows_hit(windows, hits), windows
    assert resolved["committed"] >= hits and reissued >= hits, (resolved, reissued)


def _hits_needed(runs: int) -> int:
    return 3 if runs >= 50 else 1 if runs >= SHORT_RUNS else 0


def _dangerous_windows_hit(windows: Counter[str], hits: int) -> bool:
    return windows["applied, not committed"] >= hits and windows["checked, call in the shop"] >= hits


async def a_check_passed(cp: str) -> None:
    """Return once some unsettled intent has passed its final check."""
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        while True:
            r = await http.get("/v1/intents", params={"state": "claimed,unknown"}, headers=auth("operator"))
            if any(i["checked_revision"] is not None for i in r.json()["intents"]):
                return
            await anyio.sleep(0.005)


async def in_state(cp: str, key: str, state: str) -> bool:
    current: str = (await intents(cp))[key]["state"]
    return current == state


async def stop_later(cp: str, scope: str, after: float) -> None:
    await anyio.sleep(after)
    await issue(cp, scope, reason="crash test")


@asynccontextmanager
async def control_on(db: Path, port: int) -> AsyncIterator[str]:
    """A control plane on a fixed port (and database), so it can go away and come back."""
    data = control_config({"backend": "sqlite", "path": str(db)})
    data["control"]["heartbeat_s"] = 0.5
    async with serving(create_app(parse_control_config(data)), port=port, graceful_s=1) as url:
        yield url


async def applied_then_killed(
    processes: ExecutorProcesses, config: dict[str, Any], cp: str, s: Shop, key: str
) -> None:
    """Start an executor and kill it while the shop (slower than 0.2 s) performs ``key``'s call:
    the refund applies after the kill, and the control plane never hears of it."""
    process = await anyio.to_thread.run_sync(processes.start, config)

    async def checked() -> bool:
        return (await intents(cp))[key]["checked_revision"] is not None

    await until(checked, 20)
    await anyio.sleep(0.1)  # the call reaches the shop
    await killed(process)

    async def applied() -> bool:
        return any(r["idempotency_key"] == key for r in (await ledger(s))["refunds"])

    await until(applied, 5)
    assert (await intents(cp))[key]["state"] == "claimed", "nobody but the dead executor holds it"


async def test_a_killed_executors_claimed_intent_is_unknown_after_the_restart_then_committed_once(
    tmp_path: Path,
) -> None:
    processes = ExecutorProcesses()
    async with control_plane(tmp_path / "control.db") as cp, shop(tmp_path, delay_s=1.0) as (s, up):
        config = gateway_config(up, cp)
        intent = await propose(cp, "k-1", "A-1002", 2500)
        await applied_then_killed(processes, config, cp, s, "k-1")

        restart = await anyio.to_thread.run_sync(processes.start, config)
        try:
            # Marked by the restart, then re-issued with its key (the shop takes 1 s to answer).
            await until(lambda: in_state(cp, "k-1", "unknown"), 20)
            marks = await audit_records(cp, "intent.unknown")
            assert [m["detail"]["intents"] for m in marks] == [[], [intent["intent_id"]]]
            await until(lambda: in_state(cp, "k-1", "committed"), 20)
        finally:
            await killed(restart)
        [refund] = (await ledger(s))["refunds"]
        assert (refund["idempotency_key"], refund["order_id"], refund["requests"]) == ("k-1", "A-1002", 2)
        outcome = (await intents(cp))["k-1"]["outcome"]["structuredContent"]
        assert outcome["refund_id"] == refund["refund_id"], "the re-issue answered the first refund"


async def test_a_restart_without_its_control_plane_keeps_retrying_and_resolves_once_it_is_back(
    tmp_path: Path,
) -> None:
    processes = ExecutorProcesses()
    port, db = free_port(), tmp_path / "control.db"
    async with shop(tmp_path, delay_s=0.6) as (s, up):
        async with control_on(db, port) as cp:
            config = gateway_config(up, cp)
            await propose(cp, "k-1", "A-1005", 1500)
            await applied_then_killed(processes, config, cp, s, "k-1")

        # The control plane is down: the restart must wait for it, not exit.
        restart = await anyio.to_thread.run_sync(processes.start, config)
        try:
            await anyio.sleep(1.5)
            assert restart.is_alive() and restart.exitcode is None
            async with control_on(db, port) as cp:
                await until(lambda: in_state(cp, "k-1", "committed"), 30)
                marks = await audit_records(cp, "intent.unknown")
                await killed(restart)  # before its control plane goes: no watch stream left open
        finally:
            await killed(restart)
        assert len(marks) == 2 and len(marks[1]["detail"]["intents"]) == 1
        [refund] = (await ledger(s))["refunds"]
        assert (refund["idempotency_key"], refund["requests"]) == ("k-1", 2)
