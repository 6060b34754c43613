"""What the two-step executor costs, and how fast a stop lands on the last side effect.

Run from the repository root::

    .venv/bin/python benchmarks/executor.py                      # full run, under 3 minutes
    .venv/bin/python benchmarks/executor.py --quick              # fewer intents and rounds
    .venv/bin/python benchmarks/executor.py --backend postgres   # the registry in PostgreSQL

Each part of the stack is its own process on loopback: ``haltwire control`` (SQLite registry
in a temporary directory, or with ``--backend postgres`` a schema of its own in
``HALTWIRE_POSTGRES_URL``, dropped afterwards; ``[leases]`` for the executor's own lease), ``python -m
haltwire.demo.shop`` (the refunds API that records every side effect, with its ``applied_at``
wall time) once per ``--delay-s`` variant, and ``haltwire executor`` (restarted per setting:
workers, ``poll_s``, shop). This process is the gateway (``POST /v1/intents``, as
tests/test_executor.py ``propose`` does) and the operator; it reads ``/v1/intents``, the
audit log and the shop's ``GET /ledger``. Every clock is this machine's.

1. Proposal to commit, one intent at a time (1 worker), with ``poll_s`` 0.2 (the default) and
   0.02: the intent's ``updated_at`` at commit minus its ``created_at`` (the control plane's
   clock), and the wall time this process saw (POST sent to ``committed`` read, polling every
   5 ms). Each proposal waits a random 0..poll_s first, so it lands at a random point of the
   idle executor's poll: the floor is the poll wait (poll_s / 2 on average) plus claim, check,
   upstream call and commit.
2. Throughput: intents proposed up front (executor not running), then the executor started
   with 1, 4 and 16 workers: committed per second from the first claim to the last commit, the
   audit records per intent (claim, check, commit: one each, batched or not), the durable
   writes per intent (each record names how many intents its write held: ``batch``), and the
   CPU each process spent per intent. The executor's lease renewals (one per
   ``renew_every_s``, 5 s) are not audited when granted.
3. Stop to last side effect: a feeder proposes an intent of run R every ~5 ms while the
   executor (4 workers, poll_s 0.02) carries them out against the shop (delay 0 and 0.05 s);
   at a random moment ``POST /v1/stops`` ``run:R``. From the stop's 201 to the last ledger row
   of R's keys. Intents committed after the 201 must have passed their check before the stop
   (``checked_revision`` < the stop's revision); a cancelled intent must never reach the shop.
4. The two-step's own cost: ``POST /v1/intents/{id}/check`` round trip, this process claiming
   intents as the executor role (no executor running), with claim and commit for comparison.

The "Targets" section says what held: 1,000 intents/s with 16 workers (issue 18), the stop to
the last side effect with the 50 ms call no worse than before batching (p99 45 ms then: the
target is p99 within that one call, 50 ms), and no intent performed after its stop. Exit
status 0 when every target was met, 1 when one was missed, 2 when a server failed or an intent
did not settle, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx2
import tomli_w

from haltwire.demo.shop import ORDERS
from procs import (
    HOST,
    free_port,
    load_average,
    machine_speed,
    pct,
    processes,
    run_benchmark,
    spawn,
    stop,
    tree_cpu_seconds,
    wait_ready,
)
from stop_propagation import postgres_schema

TOKENS: Final = {"operator": "tok-operator", "gateway": "tok-gateway", "executor": "tok-executor"}
EXECUTOR: Final = "executor-1"
LEASE_SECRET: Final = "bench-executor-lease-key-" + "x" * 32
ORDER_IDS: Final = sorted(ORDERS)
AMOUNT_CENTS: Final = 100  # below every order's amount: each key applies one refund
TERMINAL: Final = frozenset({"committed", "failed", "cancelled", "rejected"})
UNSETTLED: Final = "awaiting_approval,pending,claimed,unknown"
#: One intent, or one stop round, that takes this long to settle is a failure, not a sample
#: (a throughput run gets 1 s more per 10 intents past 600).
SETTLE_S: Final = 60.0
#: Issue 18's targets: committed per second with 16 workers; stop 201 to last side effect p99
#: with the 50 ms shop (before batching: 45 ms; a call checked before the stop may land up to
#: one call later).
TARGET_PER_S: Final = 1000.0
TARGET_STOP_MS: Final = 50.0
PARTS: Final = ("latency", "throughput", "stops", "check")
POSTGRES_URL: Final = os.environ.get("HALTWIRE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def control_config(registry: dict[str, Any]) -> dict[str, Any]:
    return {
        "control": {"development": True, "admin_port": 0, "enforcement_port": 0, "heartbeat_s": 1.0},
        "registry": registry,
        "leases": {"signing_key": "k1", "keys": [{"kid": "k1", "secret": LEASE_SECRET}]},
        "agent_classes": {"default": {"ttl_s": 15.0, "renew_every_s": 5.0, "renew_timeout_s": 10.0}},
        "identities": [{"name": f"{role}-1", "role": role, "token": token} for role, token in TOKENS.items()],
    }


def executor_config(control: str, shop: str, workers: int, poll_s: float) -> dict[str, Any]:
    """A gateway config as ``haltwire executor`` reads it: the shop upstream, ``[executor]``."""
    return {
        "gateway": {"development": True},
        "control": {"url": control, "token": TOKENS["gateway"], "staleness_s": 5.0},
        "intents": {"enabled": True},
        "executor": {"token": TOKENS["executor"], "workers": workers, "poll_s": poll_s, "retry_s": 0.05},
        "identities": [{"agent": "ops-bot", "tenant": "acme", "version": "1.0", "token": "tok-ops"}],
        "upstreams": [{"name": "shop", "url": f"{shop}/mcp"}],
    }


def line(label: str, values: list[float], unit: str = "ms") -> str:
    return (
        f"    {label:<44} p50 {pct(values, 0.5):8.1f}  p99 {pct(values, 0.99):8.1f}  "
        f"max {max(values):8.1f}  {unit}  (n={len(values)})"
    )


# -- the stack -----------------------------------------------------------------------------------


class Stack:
    """The control plane and the shops for the whole run; executors come and go."""

    def __init__(
        self, workdir: Path, procs: list[subprocess.Popen[bytes]], registry: dict[str, Any] | None = None
    ) -> None:
        self.workdir = workdir
        self.registry = registry or {"backend": "sqlite", "path": str(workdir / "control.db")}
        self.procs = procs
        self.control = ""
        self.shops: dict[float, str] = {}
        self.pids: dict[str, int] = {}
        self._executors = 0

    async def start(self, delays: list[float]) -> None:
        config = self.workdir / "control.toml"
        config.write_text(tomli_w.dumps(control_config(self.registry)))
        port = free_port()
        self.control = f"http://{HOST}:{port}"
        log = self.workdir / "control.log"
        self.procs.append(
            spawn(
                [sys.executable, "-m", "haltwire", "control", "--config", str(config), "--port", str(port)],
                log,
            )
        )
        await wait_ready(f"{self.control}/healthz", self.procs[-1], log)
        self.pids["control"] = self.procs[-1].pid
        for delay in delays:
            port = free_port()
            url = f"http://{HOST}:{port}"
            log = self.workdir / f"shop-{delay:g}.log"
            ledger = self.workdir / f"ledger-{delay:g}.db"
            args = [sys.executable, "-m", "haltwire.demo.shop", "--port", str(port)]
            self.procs.append(spawn([*args, "--ledger", str(ledger), "--delay-s", str(delay)], log))
            await wait_ready(f"{url}/ledger", self.procs[-1], log)
            self.shops[delay] = url
            self.pids[f"shop-{delay:g}"] = self.procs[-1].pid

    async def executor(self, delay: float, workers: int, poll_s: float) -> subprocess.Popen[bytes]:
        """``haltwire executor`` against the shop of ``delay``, once it says it is committing."""
        self._executors += 1
        name = f"executor-{self._executors}-w{workers}-p{poll_s:g}-d{delay:g}"
        config = self.workdir / f"{name}.toml"
        config.write_text(tomli_w.dumps(executor_config(self.control, self.shops[delay], workers, poll_s)))
        log = self.workdir / f"{name}.log"
        proc = spawn([sys.executable, "-m", "haltwire", "executor", "--config", str(config)], log)
        self.procs.append(proc)
        with anyio.move_on_after(30):
            while "committing intents" not in log.read_text(errors="replace"):
                if proc.poll() is not None:
                    break
                await anyio.sleep(0.05)
            else:
                return proc
        raise RuntimeError(f"the executor did not start:\n{log.read_text(errors='replace')}")

    def stop_executor(self, proc: subprocess.Popen[bytes]) -> None:
        """Only once its intents are settled: a restart would mark a claimed one unknown."""
        stop(proc)
        self.procs.remove(proc)


class Control:
    """This process's clients: the gateway proposes, the operator reads and stops, and the
    executor role claims and checks (part 4 only)."""

    def __init__(self, url: str) -> None:
        def client(role: str) -> httpx2.AsyncClient:
            headers = {"Authorization": f"Bearer {TOKENS[role]}"}
            return httpx2.AsyncClient(base_url=url, headers=headers, timeout=30)

        self.gateway, self.operator, self.executor = client("gateway"), client("operator"), client("executor")

    async def aclose(self) -> None:
        for c in (self.gateway, self.operator, self.executor):
            await c.aclose()

    async def propose(self, run: str, key: str, n: int = 0) -> httpx2.Response:
        body = {
            "run_id": run, "agent": "ops-bot", "tenant": "acme", "version": "1.0", "tool": "issue_refund",
            "arguments": {"order_id": ORDER_IDS[n % len(ORDER_IDS)], "amount_cents": AMOUNT_CENTS},
            "idempotency_key": key,
        }  # fmt: skip
        return await self.gateway.post("/v1/intents", json=body)

    async def proposed(self, run: str, key: str, n: int = 0) -> dict[str, Any]:
        r = await self.propose(run, key, n)
        if r.status_code != 201:
            raise RuntimeError(f"proposing {key}: {r.status_code} {r.text[:300]}")
        intent: dict[str, Any] = r.json()
        return intent

    async def intents(self, run: str, states: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The run's intents, oldest first (1,000 at most: no run here has more)."""
        query: dict[str, str | int] = {"run": run, "limit": limit}
        if states is not None:
            query["state"] = states
        r = await self.operator.get("/v1/intents", params=query)
        r.raise_for_status()
        found: list[dict[str, Any]] = r.json()["intents"]
        return found

    async def settled(self, run: str, count: int) -> list[dict[str, Any]]:
        """The run's intents once none is on its way (all ``count`` proposed already). Asks for
        one unsettled intent at a time: listing 1,000 every 50 ms would load the control plane."""
        within = max(SETTLE_S, count / 10)  # a slow machine still gets 10 intents/s
        with anyio.move_on_after(within):
            while await self.intents(run, UNSETTLED, limit=1):
                await anyio.sleep(0.05)
            mine = await self.intents(run)
            if len(mine) != count:
                raise RuntimeError(f"run {run}: {len(mine)} intents recorded, {count} proposed")
            return mine
        raise RuntimeError(f"run {run}: intents did not settle within {within:g} s")


async def ledger(shop: str) -> dict[str, dict[str, Any]]:
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.get(f"{shop}/ledger")
    r.raise_for_status()
    return {row["idempotency_key"]: row for row in r.json()["refunds"]}


# -- 1. proposal to commit ----------------------------------------------------------------------


@dataclass
class Latency:
    poll_s: float
    control_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


async def latency(stack: Stack, cp: Control, poll_s: float, n: int, rng: random.Random) -> Latency:
    out = Latency(poll_s)
    proc = await stack.executor(0.0, 1, poll_s)
    run = f"lat-{poll_s:g}-{uuid.uuid4().hex[:6]}"
    for i in range(-3, n):  # three warm-up intents, not counted
        await anyio.sleep(rng.uniform(0, poll_s))  # a random point of the idle executor's poll
        key = f"{run}-{i}"
        t0 = time.perf_counter()
        intent = await cp.proposed(run, key, i)
        with anyio.move_on_after(SETTLE_S):
            while intent["state"] not in TERMINAL:
                await anyio.sleep(0.005)
                r = await cp.operator.get(f"/v1/intents/{intent['intent_id']}")
                intent = r.json()
        wall = time.perf_counter() - t0
        if intent["state"] != "committed":
            raise RuntimeError(f"intent {key} ended {intent['state']}: {intent}")
        if i >= 0:
            out.control_ms.append((intent["updated_at"] - intent["created_at"]) * 1000)
            out.wall_ms.append(wall * 1000)
            out.keys.append(key)
    stack.stop_executor(proc)
    return out


# -- 2. throughput -------------------------------------------------------------------------------


@dataclass
class Throughput:
    workers: int
    n: int
    per_s: float
    seconds: float
    ids: set[str]
    keys: list[str]
    #: CPU milliseconds per intent, by process (the executor's from its ready line on).
    cpu_ms: dict[str, float] = field(default_factory=dict)
    writes: Counter[str] = field(default_factory=Counter)
    #: Durable writes by action: each record counts 1 / the intents its write held.
    durable: Counter[str] = field(default_factory=Counter)


async def throughput(stack: Stack, cp: Control, workers: int, n: int) -> Throughput:
    run = f"tp-{workers}-{uuid.uuid4().hex[:6]}"
    keys = [f"{run}-{i}" for i in range(n)]

    async def proposer(start: int) -> None:
        for i in range(start, n, 8):
            await cp.proposed(run, keys[i], i)

    async with anyio.create_task_group() as tg:
        for w in range(8):
            tg.start_soon(proposer, w)
    pids = {"control": stack.pids["control"], "shop": stack.pids["shop-0"]}
    before = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    proc = await stack.executor(0.0, workers, 0.02)
    pids["executor"] = proc.pid
    before["executor"] = tree_cpu_seconds(proc.pid)
    done = await cp.settled(run, n)
    cpu_ms = {name: (tree_cpu_seconds(pid) - before[name]) * 1000 / n for name, pid in pids.items()}
    stack.stop_executor(proc)
    bad = [i for i in done if i["state"] != "committed"]
    if bad:
        raise RuntimeError(f"{len(bad)} intent(s) of {run} not committed, e.g. {bad[0]}")
    first = min(i["claimed_at"] for i in done)
    last = max(i["updated_at"] for i in done)
    ids = {i["intent_id"] for i in done}
    return Throughput(workers, n, n / (last - first), last - first, ids, keys, cpu_ms)


async def count_writes(cp: Control, parts: list[Throughput]) -> None:
    """Audit records the executor wrote about each part's intents, by action."""
    r = await cp.operator.get("/v1/audit")
    r.raise_for_status()
    for rec in r.json()["records"]:
        if rec["actor"] != EXECUTOR:
            continue
        for part in parts:
            if rec["target"] in part.ids:
                part.writes[rec["action"]] += 1
                part.durable[rec["action"]] += 1 / rec["detail"].get("batch", 1)


# -- 3. stop to last side effect -----------------------------------------------------------------


@dataclass
class Round:
    delay: float
    proposed: int
    #: From the stop's 201 to the last ledger row of the run; negative: all applied before it.
    last_effect_ms: float
    committed: int
    cancelled: int
    committed_after: int
    violations: list[str]
    api_ms: float
    #: From the moment the stop request was sent (the API's own write included).
    from_sent_ms: float


async def stop_round(stack: Stack, cp: Control, delay: float, rng: random.Random) -> Round:
    run = f"stop-{delay:g}-{uuid.uuid4().hex[:8]}"
    stopped = anyio.Event()
    count = 0

    async def feeder() -> None:
        nonlocal count
        while not stopped.is_set():
            r = await cp.propose(run, f"{run}-{count}", count)
            if r.status_code == 409 and r.json()["error"]["code"] == "stopped":
                return  # proposed after the stop: refused, nothing recorded
            if r.status_code != 201:
                raise RuntimeError(f"proposing: {r.status_code} {r.text[:300]}")
            count += 1
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(feeder)
        await anyio.sleep(rng.uniform(0.15, 0.5))
        sent, sent_wall = time.perf_counter(), time.time()
        r = await cp.operator.post("/v1/stops", json={"scope": f"run:{run}", "reason": "benchmark"})
        answered = time.time()
        api_ms = (time.perf_counter() - sent) * 1000
        stopped.set()
    if r.status_code != 201:
        raise RuntimeError(f"the stop was refused: {r.status_code} {r.text[:300]}")
    stop = r.json()
    done = await cp.settled(run, count)
    applied = {k: row for k, row in (await ledger(stack.shops[delay])).items() if k.startswith(f"{run}-")}
    violations = []
    for i in done:
        key = i["idempotency_key"]
        if i["state"] == "committed":
            if i["checked_revision"] is None or i["checked_revision"] >= stop["revision"]:
                violations.append(
                    f"{key} committed, checked at {i['checked_revision']} >= {stop['revision']}"
                )
            if key not in applied or applied[key]["requests"] != 1:
                violations.append(f"{key} committed but not applied exactly once")
        elif key in applied:
            violations.append(f"{key} {i['state']} but applied by the shop")
    last = max((row["applied_at"] for row in applied.values()), default=answered)
    states = Counter(i["state"] for i in done)
    after = sum(1 for i in done if i["state"] == "committed" and i["updated_at"] > answered)
    return Round(
        delay, count, (last - answered) * 1000, states["committed"], states["cancelled"], after,
        violations, api_ms, (last - sent_wall) * 1000,
    )  # fmt: skip


async def stops(stack: Stack, cp: Control, delay: float, rounds: int, rng: random.Random) -> list[Round]:
    proc = await stack.executor(delay, 4, 0.02)
    out = [await stop_round(stack, cp, delay, rng) for _ in range(rounds)]
    stack.stop_executor(proc)
    return out


# -- 4. the check's round trip ------------------------------------------------------------------


async def check_cost(cp: Control, n: int) -> dict[str, list[float]]:
    """Claim, check and commit as the executor role, one intent at a time (no executor running)."""
    run = f"check-{uuid.uuid4().hex[:6]}"
    times: dict[str, list[float]] = {"claim": [], "check": [], "commit": []}
    for i in range(-3, n):
        intent = await cp.proposed(run, f"{run}-{i}", i)
        steps: list[tuple[str, str, dict[str, Any] | None]] = [
            ("claim", "/v1/intents/claim", None),
            ("check", f"/v1/intents/{intent['intent_id']}/check", None),
            ("commit", f"/v1/intents/{intent['intent_id']}/commit", {"outcome": {"content": []}}),
        ]
        for name, path, body in steps:
            t0 = time.perf_counter()
            r = await cp.executor.post(path, json=body)
            took = (time.perf_counter() - t0) * 1000
            if r.status_code != 200 or r.json()["intent_id"] != intent["intent_id"]:
                raise RuntimeError(f"{name} {intent['intent_id']}: {r.status_code} {r.text[:300]}")
            if i >= 0:
                times[name].append(took)
    return times


# -- the run -------------------------------------------------------------------------------------


async def bench(
    opts: argparse.Namespace, workdir: Path, registry: dict[str, Any] | None
) -> list[tuple[str, bool | None]]:
    rng = random.Random(opts.seed)
    targets: list[tuple[str, bool | None]] = []
    lat: list[Latency] = []
    tps: list[Throughput] = []
    rounds: dict[float, list[Round]] = {}
    cost: dict[str, list[float]] = {}
    with processes() as procs:
        stack = Stack(workdir, procs, registry)
        await stack.start([0.0, 0.05])
        cp = Control(stack.control)
        try:
            # 1.
            if "latency" in opts.parts:
                print(
                    f"1. proposal to commit, one intent at a time, 1 worker, shop delay 0 ({opts.latency_n} each)"
                )
                lat = [await latency(stack, cp, poll, opts.latency_n, rng) for poll in (0.2, 0.02)]
                for part in lat:
                    print(line(f"poll_s {part.poll_s:g}: created_at -> committed (control)", part.control_ms))
                    print(line(f"poll_s {part.poll_s:g}: POST sent -> committed seen (wall)", part.wall_ms))
                print(
                    "    floor: an idle worker claims again only after poll_s (a proposal waits poll_s / 2\n"
                    "    on average, poll_s at worst), plus claim + check + upstream call + commit\n"
                    "    (each a control-plane write)"
                )
                print()
            # 2.
            if "throughput" in opts.parts:
                print(
                    f"2. throughput: {opts.throughput_n} intents proposed up front, shop delay 0, poll_s 0.02"
                )
                tps = [await throughput(stack, cp, w, opts.throughput_n) for w in (1, 4, 16)]
                await count_writes(cp, tps)
                for tp in tps:
                    writes = " ".join(
                        f"{a.removeprefix('intent.')} {c / tp.n:.2f}" for a, c in sorted(tp.writes.items())
                    )
                    durable = " ".join(
                        f"{a.removeprefix('intent.')} {c / tp.n:.2f}" for a, c in sorted(tp.durable.items())
                    )
                    cpu = ", ".join(f"{name} {ms:.2f}" for name, ms in tp.cpu_ms.items())
                    print(
                        f"    workers {tp.workers:>2}: {tp.per_s:7.1f} committed/s "
                        f"({tp.n} in {tp.seconds:5.2f} s); "
                        f"executor audit records per intent: {sum(tp.writes.values()) / tp.n:.2f} ({writes})\n"
                        f"                durable writes per intent: {sum(tp.durable.values()) / tp.n:.2f} "
                        f"({durable}); CPU ms per intent: {cpu}"
                    )
                print(
                    "    (+ the executor's lease renewal: one request per 5 s whatever the load, not audited)"
                )
                print()
            # 3.
            if "stops" in opts.parts:
                print(
                    "3. stop to last side effect: feeder every ~5 ms, 4 workers, poll_s 0.02, "
                    f"{opts.rounds} rounds per delay"
                )
                rounds = {d: await stops(stack, cp, d, opts.rounds, rng) for d in (0.0, 0.05)}
                for d, rs in rounds.items():
                    print(f"  shop delay {d * 1000:g} ms:")
                    print(line("stop 201 -> last ledger row of the run", [r.last_effect_ms for r in rs]))
                    print(line("stop sent -> last ledger row of the run", [r.from_sent_ms for r in rs]))
                    print(line("POST /v1/stops round trip", [r.api_ms for r in rs]))
                    after = sum(r.committed_after for r in rs)
                    proposed, committed = sum(r.proposed for r in rs), sum(r.committed for r in rs)
                    cancelled = sum(r.cancelled for r in rs)
                    before = sum(1 for r in rs if r.last_effect_ms < 0)
                    print(
                        f"    intents: {proposed} proposed, {committed} committed "
                        f"({after} committed after the 201), "
                        f"{cancelled} cancelled; rounds whose last side effect came before the 201: {before}"
                    )
                    bad = [v for r in rs for v in r.violations]
                    print(
                        "    violations (committed with a check at/after the stop, or cancelled yet applied): "
                        f"{len(bad)}"
                    )
                    for v in bad[:5]:
                        print(f"      {v}")
                print()
            # 4.
            if "check" in opts.parts:
                print(
                    "4. the final check's cost: this process as the executor role, "
                    f"{opts.latency_n} intents, one at a time"
                )
                cost = await check_cost(cp, opts.latency_n)
                for name in ("claim", "check", "commit"):
                    print(
                        line(
                            f"POST /v1/intents/{{id}}/{name}"
                            if name != "claim"
                            else "POST /v1/intents/claim",
                            cost[name],
                        )
                    )
                print()
        finally:
            await cp.aclose()
    # Targets.
    for part in lat:
        targets.append(
            (
                f"poll_s {part.poll_s:g}: proposal to commit p50 {pct(part.control_ms, 0.5):.0f} ms, "
                f"p99 {pct(part.control_ms, 0.99):.0f} ms "
                f"(floor ~poll_s/2 = {part.poll_s * 500:.0f} ms + the work)",
                None,
            )
        )
    if tps:
        targets.append(
            ("throughput " + ", ".join(f"{tp.per_s:.0f}/s at {tp.workers} workers" for tp in tps), None)
        )
    for tp in tps[-1:]:
        targets.append(
            (
                f"{tp.workers} workers: {tp.per_s:.0f} intents/s, at least {TARGET_PER_S:.0f}",
                tp.per_s >= TARGET_PER_S,
            )
        )
    for tp in tps[-1:]:
        targets.append(
            (
                "every intent claimed, checked and committed with an audit record of its own",
                all(
                    tp.writes == Counter({"intent.claim": tp.n, "intent.check": tp.n, "intent.commit": tp.n})
                    for tp in tps
                ),
            )
        )
    violations = sum(len(r.violations) for rs in rounds.values() for r in rs)
    if rounds:
        targets.append(
            (
                "no intent committed with a check at or after the stop's revision; none cancelled applied",
                violations == 0,
            )
        )
    for d, rs in rounds.items():
        p99 = pct([r.last_effect_ms for r in rs], 0.99)
        sign = "+ " if p99 >= d * 1000 else "- "
        with_call = d == 0.05
        targets.append(
            (
                f"shop delay {d * 1000:g} ms: stop 201 to last side effect p99 {p99:.1f} ms "
                f"(= delay {sign}{abs(p99 - d * 1000):.1f} ms; negative: it came before the 201)"
                + (f", at most {TARGET_STOP_MS:g}" if with_call else ""),
                p99 <= TARGET_STOP_MS if with_call else None,
            )
        )
    if cost:
        targets.append(
            (
                f"the final check costs p50 {pct(cost['check'], 0.5):.1f} ms, "
                f"p99 {pct(cost['check'], 0.99):.1f} ms per intent",
                None,
            )
        )
    return targets


async def run(opts: argparse.Namespace) -> int:
    t0 = time.monotonic()
    print(
        f"haltwire executor benchmark ({'quick' if opts.quick else 'full'} run), "
        f"Python {sys.version.split()[0]}, "
        f"load average {load_average()} at the start; {machine_speed()}"
    )
    print(
        f"    haltwire control ({'PostgreSQL' if opts.backend == 'postgres' else 'SQLite'}), "
        "python -m haltwire.demo.shop (delay 0 and 0.05 s),\n"
        "    haltwire executor:\n"
        "    each its own process, on loopback; this process proposes as the gateway"
    )
    print()
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="hwbench-executor-") as tmp:
        registry = None
        if opts.backend == "postgres":
            registry = {
                "backend": "postgres",
                "url": POSTGRES_URL,
                "schema": stack.enter_context(postgres_schema(POSTGRES_URL)),
            }
        targets = await bench(opts, Path(tmp), registry)
    print("Targets:")
    for what, ok in targets:
        print(f"    [{'info' if ok is None else 'met' if ok else 'MISSED'}] {what}")
    print()
    print(f"(took {time.monotonic() - t0:.0f} s; load average {load_average()} at the end; {machine_speed()})")
    return 1 if any(ok is False for _, ok in targets) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer intents and rounds")
    parser.add_argument("--seed", type=int, default=7, help="random seed (proposal and stop moments)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite", help="the registry's")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"the parts to run, separated by commas (default all: {','.join(PARTS)})",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="stop rounds per delay (default 20, quick 8)"
    )
    opts = parser.parse_args(argv)
    opts.latency_n = 50 if opts.quick else 200
    opts.throughput_n = 200 if opts.quick else 1000
    opts.rounds = opts.rounds or (8 if opts.quick else 20)
    opts.parts = [p for p in opts.parts.split(",") if p]
    if not opts.parts or not set(opts.parts) <= set(PARTS):
        parser.error(f"--parts: one or more of {', '.join(PARTS)}")
    return run_benchmark(lambda: run(opts))


if __name__ == "__main__":
    sys.exit(main())
