"""The control plane under failure: kill -9, forced disconnects, a silently blocked port.

Real processes and real sockets: the control plane runs as ``python -m haltwire control``
when the test kills it, and the network faults come from ``tcp_proxy.TcpProxy``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import psycopg
import pytest
from mcp import Client
from psycopg import sql

from control_harness import TOKEN, auth, control
from control_harness import config_dict as control_config
from control_harness import issue as issue_on
from haltwire.runtime import ControlClient, ControlUnreachable
from haltwire.store.registry.postgres import DEFAULT_URL
from haltwire.store.registry.sqlite import SqliteRegistry
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream, service_missing
from ports import free_port, free_ports
from stops_harness import STALENESS_S, code_of, control_plane, gateway_config, issue, until
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

#: Generous: the machine is shared and small; the bound under test is STALENESS_S.
MARGIN_S = 3.0


# -- the control plane as a process ------------------------------------------------------------


def _toml(value: Any) -> str:
    return "true" if value is True else "false" if value is False else json.dumps(value)


def write_config(path: Path, port: int, registry: dict[str, Any], heartbeat_s: float = 0.2) -> Path:
    """The test control plane's config (development tokens from test_control) as a TOML file."""
    data = control_config(registry, heartbeat_s)
    lines = ["[control]", f"port = {port}", "admin_port = 0", "enforcement_port = 0"]
    lines += [f"{k} = {_toml(v)}" for k, v in data["control"].items()]
    lines += ["", "[registry]", *(f"{k} = {_toml(v)}" for k, v in registry.items())]
    for identity in data["identities"]:
        lines += ["", "[[identities]]", *(f"{k} = {_toml(v)}" for k, v in identity.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


class ControlProcess:
    """``python -m haltwire control --config FILE``, started, awaited and killed by the test."""

    def __init__(self, config: Path, port: int) -> None:
        self.config, self.port = config, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = config.with_suffix(".log")
        self.proc: anyio.abc.Process | None = None

    async def start(self, within: float = 30.0) -> None:
        with self.log.open("ab") as log:
            self.proc = await anyio.open_process(
                [sys.executable, "-m", "haltwire", "control", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        async with httpx2.AsyncClient(base_url=self.url, timeout=2) as http:
            with anyio.fail_after(within):
                while True:
                    assert self.proc.returncode is None, self.log.read_text()
                    try:
                        if (await http.get("/healthz")).status_code == 200:
                            return
                    except httpx2.TransportError:
                        pass
                    await anyio.sleep(0.05)

    async def kill_9(self) -> None:
        """SIGKILL: no shutdown, no flush, no goodbye to open connections."""
        assert self.proc is not None and self.proc.returncode is None
        self.proc.send_signal(signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            with anyio.CancelScope(shield=True):
                await self.proc.wait()


@asynccontextmanager
async def control_process(config: Path, port: int) -> AsyncIterator[ControlProcess]:
    process = ControlProcess(config, port)
    try:
        yield process
    finally:
        await process.stop()


@contextmanager
def registry_section(backend: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A fresh registry: a SQLite file, or a unique PostgreSQL schema dropped afterwards."""
    if backend == "sqlite":
        yield {"backend": "sqlite", "path": str(tmp_path / "control.db")}
        return
    schema = f"test_failures_{uuid.uuid4().hex[:12]}"
    try:
        psycopg.connect(DEFAULT_URL, connect_timeout=3).close()
    except psycopg.OperationalError:
        service_missing("PostgreSQL")
    try:
        yield {"backend": "postgres", "url": DEFAULT_URL, "schema": schema}
    finally:
        with psycopg.connect(DEFAULT_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# -- a. kill -9 loses no acknowledged write ----------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_kill_9_after_the_last_acknowledgement_loses_no_stop_or_clear(
    tmp_path: Path, backend: str
) -> None:
    port = free_port()
    with registry_section(backend, tmp_path) as registry:
        config = write_config(tmp_path / "control.toml", port, registry)
        async with control_process(config, port) as plane:
            await plane.start()
            acknowledged: dict[str, dict[str, Any]] = {}
            audited: list[tuple[str, str]] = []
            async with httpx2.AsyncClient(base_url=plane.url, timeout=10) as http:
                for i, scope in enumerate(["agent:a1", "tool:refund", "tenant:t1", "global", "run:r9"]):
                    if i == 3:
                        first = next(iter(acknowledged))
                        r = await http.post(
                            f"/v1/stops/{first}/clear", json={"reason": "ok"}, headers=auth("operator")
                        )
                        assert r.status_code == 200, r.text
                        acknowledged[first] = r.json()
                        audited.append(("stop.clear", first))
                    r = await http.post(
                        "/v1/stops", json={"scope": scope, "reason": f"r{i}"}, headers=auth("operator")
                    )
                    assert r.status_code == 201, r.text
                    if i == 4:
                        await plane.kill_9()  # right after the last acknowledgement arrived
                    acknowledged[r.json()["stop_id"]] = r.json()
                    audited.append(("stop.issue", scope))

            await plane.start()  # the same store, a new process
            async with httpx2.AsyncClient(base_url=plane.url, timeout=10) as http:
                every = (await http.get("/v1/stops?all=1", headers=auth("viewer"))).json()["stops"]
                assert {s["stop_id"]: s for s in every} == acknowledged
                revisions = sorted(
                    r for s in acknowledged.values() for r in (s["revision"], s["cleared_revision"]) if r
                )
                assert revisions == list(range(1, len(audited) + 1))
                health = (await http.get("/healthz")).json()
                assert health == {"ok": True, "revision": len(audited)}
                verified = (await http.get("/v1/audit/verify", headers=auth("viewer"))).json()
                assert verified["ok"] is True and verified["checked"] == len(audited), verified
                records = (await http.get("/v1/audit", headers=auth("viewer"))).json()["records"]
                assert [(r["action"], r["target"], r["outcome"]) for r in records] == [
                    (action, target, "ok") for action, target in audited
                ]


LEASES_TOML = """
[leases]
signing_key = "k1"

[[leases.keys]]
kid = "k1"
secret = "kill-rounds-lease-key-xxxxxxxxxxxxxxxxxxxxxxxx"
"""


@pytest.mark.timeout(400)
@pytest.mark.parametrize("rounds", [1, pytest.param(3, marks=pytest.mark.soak)], ids=["1-round", "3-rounds"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_kill_9_rounds_leave_no_write_without_its_audit_record(
    tmp_path: Path, backend: str, rounds: int
) -> None:
    """The issue's kill rounds (each a fresh start of two processes): stops, clears and runs
    written from four clients at once, the control plane killed with SIGKILL at a random moment,
    restarted. Every stop and run that exists has its audit record (``verify`` checks the
    registry against the log), and every write that was acknowledged exists. One round in the
    default run; the soak variant (``-m soak``) runs 3 rounds."""
    rng = random.Random(os.environ.get("HALTWIRE_CRASH_SEED", "kill-rounds"))
    port = free_port()
    with registry_section(backend, tmp_path) as registry:
        config = write_config(tmp_path / "control.toml", port, registry)
        config.write_text(config.read_text() + LEASES_TOML)
        acknowledged: set[str] = set()
        runs: set[str] = set()
        async with control_process(config, port) as plane:
            for round_ in range(rounds):
                await plane.start(within=120)  # two processes' imports, on a busy 2-core machine
                async with httpx2.AsyncClient(base_url=plane.url, timeout=5) as http:

                    async def writer(n: int, http: httpx2.AsyncClient = http, round_: int = round_) -> None:
                        for i in itertools.count():
                            try:
                                if i % 3 == 2:
                                    r = await http.post("/v1/runs", json={}, headers=auth("agent"))
                                    if r.status_code == 201:
                                        runs.add(r.json()["run"]["run_id"])
                                    continue
                                body = {"scope": f"run:w{round_}-{n}-{i}", "reason": "kill rounds"}
                                r = await http.post("/v1/stops", json=body, headers=auth("operator"))
                                if r.status_code == 201:
                                    acknowledged.add(r.json()["stop_id"])
                                    if i % 2:
                                        clear = f"/v1/stops/{r.json()['stop_id']}/clear"
                                        await http.post(clear, json={"reason": "ok"}, headers=auth("operator"))
                            except httpx2.TransportError:
                                return  # killed

                    before = len(acknowledged), len(runs)
                    async with anyio.create_task_group() as tg:
                        for n in range(4):
                            tg.start_soon(writer, n)
                        # Some writes of each kind in every round (a busy machine may be slow to
                        # make any), then the kill at a random moment among the later ones.
                        with anyio.fail_after(60):
                            while len(acknowledged) < before[0] + 4 or len(runs) < before[1] + 4:
                                await anyio.sleep(0.01)
                        await anyio.sleep(rng.uniform(0.0, 0.6))
                        await plane.kill_9()
            await plane.start(within=120)
            async with httpx2.AsyncClient(base_url=plane.url, timeout=10) as http:
                verified = (await http.get("/v1/audit/verify", headers=auth("viewer"))).json()
                assert verified["ok"] is True, verified
                stops = (await http.get("/v1/stops?all=1", headers=auth("viewer"))).json()["stops"]
                assert acknowledged <= {s["stop_id"] for s in stops}
                records = (await http.get("/v1/audit", headers=auth("viewer"))).json()["records"]
                registered = {r["target"] for r in records if r["action"] == "run.register" and r["outcome"] == "ok"}
                listed = (await http.get("/v1/runs?limit=1000", headers=auth("operator"))).json()["runs"]
                assert {r["run_id"] for r in listed} == registered and runs <= registered
                assert len(acknowledged) > 3 and len(runs) > 3, (len(acknowledged), len(runs))


# -- b. the watch stream resumes exactly across forced disconnects -----------------------------

CUTS = 100
CHANGES = 150


async def test_watch_through_100_forced_disconnects_misses_and_repeats_nothing(tmp_path: Path) -> None:
    seen: list[int] = []
    cuts = changes = 0
    pending = 0  # cuts made while acknowledged changes were still on their way to the watcher

    async with control(tmp_path, heartbeat_s=0.1) as (client, _):
        port = int(str(client.base_url).rstrip("/").rsplit(":", 1)[1])

        async def watcher(proxy: TcpProxy) -> None:
            """A client that resumes from the last id it saw, immediately, after any failure."""
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=5) as http:
                while True:
                    headers = {**auth("gateway"), "Last-Event-ID": str(seen[-1] if seen else 0)}
                    try:
                        async with http.stream("GET", "/v1/watch", headers=headers) as response:
                            assert response.status_code == 200
                            event: dict[str, str] = {}
                            async for line in response.aiter_lines():
                                if line and not line.startswith(":"):
                                    key, _, value = line.partition(":")
                                    event[key] = value.removeprefix(" ")
                                elif not line and event:
                                    if event.get("event") in ("stop", "clear"):
                                        assert json.loads(event["data"])["revision"] == int(event["id"])
                                        seen.append(int(event["id"]))
                                    event = {}
                    except httpx2.TransportError:
                        pass

        async def writer() -> None:
            nonlocal changes
            issued: list[str] = []
            while changes < CHANGES or cuts < CUTS:
                if len(issued) > 2 and changes % 3 == 2:
                    r = await client.post(
                        f"/v1/stops/{issued.pop(0)}/clear", json={"reason": "ok"}, headers=auth("operator")
                    )
                    assert r.status_code == 200, r.text
                else:
                    issued.append((await issue_on(client, f"run:r{changes}"))["stop_id"])
                changes += 1

        async def cutter(proxy: TcpProxy) -> None:
            nonlocal cuts, pending
            rng = random.Random(7)
            while cuts < CUTS:
                while not proxy.connections:
                    await anyio.sleep(0.001)
                # Spread out: right after a reconnect (mid-replay), and mid-stream among pushes.
                await anyio.sleep(rng.choice([0, 0.001, 0.005, 0.01, 0.02]))
                behind = (seen[-1] if seen else 0) < changes
                if proxy.cut():
                    cuts += 1
                    pending += behind

        started = anyio.current_time()
        async with TcpProxy.running(port) as proxy, anyio.create_task_group() as tg:
            tg.start_soon(watcher, proxy)
            with anyio.fail_after(60):  # a stuck watcher fails here, not at the suite timeout
                async with anyio.create_task_group() as faults:
                    faults.start_soon(writer)
                    faults.start_soon(cutter, proxy)
            final = (await client.get("/healthz")).json()["revision"]

            async def caught_up() -> bool:
                return bool(seen) and seen[-1] >= final

            await until(caught_up, within=10)
            tg.cancel_scope.cancel()
        elapsed = anyio.current_time() - started

    assert cuts == CUTS and proxy.accepted > CUTS
    assert final >= CHANGES
    assert seen == list(range(1, final + 1)), f"gaps or repeats after {cuts} cuts"
    assert pending > 0, "no cut landed while changes were in flight"
    print(
        f"{final} changes, {cuts} cuts ({pending} with changes in flight), {proxy.accepted} connections in {elapsed:.2f} s"
    )


# -- c, d. a gateway that loses its control plane fails closed, then loses no stop -------------


async def fails_closed(clients: list[Client], within: float) -> float:
    """Seconds until every client's call is refused ``registry_unreachable``."""
    started = anyio.current_time()

    async def all_refused() -> bool:
        return all([await code_of(c) == "registry_unreachable" for c in clients])

    await until(all_refused, within=within)
    return anyio.current_time() - started


async def refusal_of(client: Client, tool: str = "lookup_order") -> tuple[str | None, str | None]:
    result = await client.call_tool(tool, {"order_id": "A-1"})
    error = (result.structured_content or {}).get("error", {}) if result.is_error else {}
    return error.get("code"), error.get("stop_id")


async def restored(ops: Client, billing: Client, stops: dict[str, str], within: float) -> float:
    """Seconds until ops-bot is served again; then every stop in ``stops`` (tool name to the
    stop id refusing it: lookup_order for billing-bot, any other tool for ops-bot) holds."""
    started = anyio.current_time()

    async def served() -> bool:
        return await code_of(ops) is None

    await until(served, within=within)
    took = anyio.current_time() - started
    for tool, stop_id in stops.items():
        client = billing if tool == "lookup_order" else ops
        assert await refusal_of(client, tool) == ("stopped", stop_id), tool
    return took


@asynccontextmanager
async def two_agents(gateway_url: str) -> AsyncIterator[tuple[Client, Client]]:
    async with (
        connect(gateway_url, TOKENS["ops-bot"]) as ops,
        connect(gateway_url, TOKENS["billing-bot"]) as billing,
    ):
        yield ops, billing


async def test_a_silently_blocked_control_port_fails_closed_and_unblocking_loses_no_stop(
    tmp_path: Path,
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        TcpProxy.running(int(cp.rsplit(":", 1)[1])) as proxy,
        running_upstream() as (demo, up),
        running_gateway(gateway_config(up, proxy.url)) as (_, url),
        two_agents(url) as (ops, billing),
    ):
        first = await issue(cp, "agent:billing-bot")

        async def held() -> bool:
            return await refusal_of(billing) == ("stopped", first["stop_id"])

        await until(held)
        assert await code_of(ops) is None

        proxy.block()  # no FIN, no RST: the watch stream just goes quiet
        took = await fails_closed([ops, billing], within=STALENESS_S + MARGIN_S)
        during = await issue(cp, "tool:sleep")  # straight to the control plane
        async with httpx2.AsyncClient(timeout=STALENESS_S) as http:
            with pytest.raises(httpx2.ReadTimeout):  # a new connection is taken, and never answered
                await http.get(f"{proxy.url}/healthz")
        served = dict(demo.served)
        assert await code_of(ops) == "registry_unreachable", "still blocked: still closed"
        assert await code_of(ops, "sleep") == "registry_unreachable"
        assert dict(demo.served) == served, "a refused call reaches no upstream"

        proxy.unblock()
        back = await restored(
            ops, billing, {"lookup_order": first["stop_id"], "sleep": during["stop_id"]}, within=15
        )
    print(
        f"blocked: refused after {took:.2f} s (staleness {STALENESS_S} s); restored {back:.2f} s after unblock"
    )


async def test_a_stop_issued_during_an_outage_holds_even_if_the_resumed_stream_stalls(
    tmp_path: Path,
) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        TcpProxy.running(int(cp.rsplit(":", 1)[1])) as proxy,
        running_upstream() as (_, up),
        running_gateway(gateway_config(up, proxy.url)) as (_, url),
        connect(url, TOKENS["ops-bot"]) as ops,
    ):
        assert await code_of(ops) is None
        proxy.block()
        await fails_closed([ops], within=STALENESS_S + MARGIN_S)
        await issue(cp, "agent:ops-bot")
        proxy.stall_after_headers()  # the resumed stream is accepted, then silent
        codes: set[str | None] = set()
        ends = anyio.current_time() + STALENESS_S + 1.0
        while anyio.current_time() < ends:
            codes.add(await code_of(ops))
            await anyio.sleep(0.05)
        # Never served: stopped once the replay arrives, registry_unreachable until then.
        assert codes <= {"stopped", "registry_unreachable"}, codes


async def test_a_control_plane_killed_under_a_gateway_fails_closed_and_its_restart_restores_every_stop(
    tmp_path: Path,
) -> None:
    port = free_port()
    db = tmp_path / "control.db"
    config = write_config(tmp_path / "control.toml", port, {"backend": "sqlite", "path": str(db)})
    async with control_process(config, port) as plane:
        await plane.start()
        first = await issue(plane.url, "agent:billing-bot")
        async with (
            running_upstream() as (_, up),
            running_gateway(gateway_config(up, plane.url)) as (_, url),
            two_agents(url) as (ops, billing),
        ):
            assert await refusal_of(billing) == ("stopped", first["stop_id"])
            assert await code_of(ops) is None
            last = await issue(plane.url, "tool:sleep")
            await plane.kill_9()  # right after the acknowledgement: the gateway may not have heard it

            took = await fails_closed([ops, billing], within=STALENESS_S + MARGIN_S)
            # A change the gateway cannot have heard: written to the store while no plane runs.
            registry = await SqliteRegistry.open(db)
            try:
                outage = await registry.issue_stop(
                    "tool:progress", "during the outage", "operator-1", now=time.time()
                )
            finally:
                await registry.aclose()
            await plane.start()  # the same file and port
            stops = {"lookup_order": first["stop_id"], "sleep": last["stop_id"], "progress": outage.stop_id}
            back = await restored(ops, billing, stops, within=15)
    print(
        f"killed: refused after {took:.2f} s (staleness {STALENESS_S} s); restored {back:.2f} s after restart"
    )


# -- e. several replicas: an enforcement point fails over without going stale ---------------------

#: With two replicas: stale after 3 s, a silent replica left after 1 s (heartbeat 0.2 s).
REPLICA_STALENESS_S = 3.0
FAILOVER_S = 1.0


def following(upstream: str, replicas: list[str]) -> dict[str, Any]:
    """A gateway config whose ``[control]`` lists ``replicas``."""
    link = {"url": replicas, "token": "tok-gateway", "staleness_s": REPLICA_STALENESS_S, "failover_s": FAILOVER_S}
    return config_dict(upstream, control=link)


async def codes_while(client: Client, seen: list[str | None], stop: anyio.Event) -> None:
    """Call ``client`` in a loop until ``stop``, recording each answer's refusal code."""
    while not stop.is_set():
        seen.append(await code_of(client))
        await anyio.sleep(0.02)


async def test_a_gateway_following_two_replicas_survives_a_kill_9_of_the_one_it_follows(tmp_path: Path) -> None:
    with registry_section("postgres", tmp_path) as registry:
        ports = free_ports(2)
        configs = [write_config(tmp_path / f"replica-{i}.toml", p, registry) for i, p in enumerate(ports)]
        async with control_process(configs[0], ports[0]) as a, control_process(configs[1], ports[1]) as b:
            await a.start()
            await b.start()
            async with (
                running_upstream() as (_, up),
                running_gateway(following(up, [a.url, b.url])) as (_, url),
                two_agents(url) as (ops, billing),
            ):
                first = await issue(a.url, "agent:billing-bot")

                async def held() -> bool:
                    return await refusal_of(billing) == ("stopped", first["stop_id"])

                await until(held)
                seen: list[str | None] = []
                done = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(codes_while, ops, seen, done)
                    await anyio.sleep(0.3)
                    await a.kill_9()  # the replica the gateway follows
                    killed_at = len(seen)
                    await anyio.sleep(REPLICA_STALENESS_S + 0.5)  # past the staleness bound
                    done.set()
                second = await issue(b.url, "agent:ops-bot")  # through the survivor

                async def pushed() -> bool:
                    return await refusal_of(ops) == ("stopped", second["stop_id"])

                await until(pushed, within=REPLICA_STALENESS_S)
                assert await refusal_of(billing) == ("stopped", first["stop_id"]), "the earlier stop holds"
        assert len(seen) > killed_at > 0
        assert set(seen) == {None}, f"ops-bot was refused {set(seen) - {None}} after the kill"
        print(f"ops-bot served {len(seen)} times, {len(seen) - killed_at} after the kill -9 of the followed replica")


async def test_a_silent_replica_is_left_before_the_gateway_goes_stale(tmp_path: Path) -> None:
    # Two control planes on one SQLite file are replicas too: each re-reads the file once a
    # heartbeat, so a stop through one reaches watchers of the other.
    db = tmp_path / "control.db"
    async with (
        control_plane(db) as first,
        control_plane(db) as second,
        TcpProxy.running(int(first.rsplit(":", 1)[1])) as proxy,
        running_upstream() as (_, up),
        running_gateway(following(up, [proxy.url, second])) as (_, url),
        two_agents(url) as (ops, billing),
    ):
        assert await code_of(ops) is None
        seen: list[str | None] = []
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(codes_while, ops, seen, done)
            proxy.block()  # no FIN, no RST: the followed replica just goes quiet
            await anyio.sleep(REPLICA_STALENESS_S + 0.5)
            stop = await issue(second, "agent:billing-bot")

            async def held() -> bool:
                return await refusal_of(billing) == ("stopped", stop["stop_id"])

            await until(held, within=REPLICA_STALENESS_S)
            done.set()
        proxy.unblock()
    assert seen and set(seen) == {None}, f"ops-bot was refused {set(seen) - {None}} while a replica was silent"


async def test_clients_of_the_control_plane_skip_a_replica_that_cannot_be_reached(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: the connection is refused
    async with control_plane(tmp_path / "control.db") as live:
        async with httpx2.AsyncClient(timeout=5) as http:
            r = await http.post(f"{live}/v1/stops", json={"scope": "tool:x", "reason": "r"}, headers=auth("operator"))
            assert r.status_code == 201
        async with ControlClient([dead, live], TOKEN["operator"]) as client:
            stops = await client._call("GET", "/v1/stops")
            assert [s["scope"] for s in stops["stops"]] == ["tool:x"]
            assert client.url == live.rstrip("/"), "the replica that answered is kept"
        async with ControlClient([dead], TOKEN["operator"]) as client:
            with pytest.raises(ControlUnreachable, match="no replica could be reached"):
                await client._call("GET", "/v1/stops")
