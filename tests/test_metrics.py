"""``/metrics`` on the gateway, the control plane and the executor: the counters move with what
happens (a budget refusal, a stop, an intent), label sets stay bounded, and refusals are logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import httpx2
import pytest
import tomli_w
from mcp.shared.exceptions import MCPError

from cli_process import run_haltwire
from control_harness import auth
from control_process import ControlCommand, stopped
from egress_harness import basic, connect_via, egress_config, http_target, running_egress
from executor_harness import control_plane as control_plane_for_executor
from executor_harness import executor, settled, shop
from executor_harness import gateway_config as executor_gateway_config
from executor_harness import propose as propose_intent
from harness import TOKENS, config_dict, connect, running_gateway, running_upstream
from intents_harness import propose, sqlite
from leases_harness import LEASES, call, client, mint
from metrics_harness import control_with_admin, json_log, lines, scrape, series, value
from ports import free_port
from runs_harness import config_dict as runs_config
from runs_harness import register
from stops_harness import code_of, control_plane, gateway_config, issue, until
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

CALLS = "haltwire_gateway_tool_calls_total"


def metrics_url(mcp_url: str) -> str:
    return mcp_url.removesuffix("/mcp") + "/metrics"


async def test_a_budget_refusal_moves_the_gateways_counters_and_is_logged_with_its_run() -> None:
    data = config_dict("", limits={"budget": 2}, leases=LEASES)
    async with running_upstream() as (_, up):
        data["upstreams"][0]["url"] = f"{up}/mcp"
        async with running_gateway(data) as (_, url), client(url) as c:
            with json_log() as buffer:
                codes = [await call(c, mint("run-7")) for _ in range(3)]
            samples = await scrape(metrics_url(url))
    assert [None if e is None else e["code"] for e in codes] == [None, None, "budget_exhausted"]
    assert value(samples, CALLS, tool="lookup_order", outcome="ok") == 2
    assert value(samples, CALLS, tool="lookup_order", outcome="refused") == 1
    refusals = "haltwire_gateway_refusals_total"
    assert value(samples, refusals, code="budget_exhausted", retryable="false") == 1
    assert value(samples, "haltwire_gateway_call_duration_seconds_count", kind="tool") == 3
    assert value(samples, "haltwire_gateway_upstream_duration_seconds_count", upstream="demo") == 2
    assert value(samples, "haltwire_gateway_leases_total", result="accepted") == 3
    assert value(samples, "haltwire_gateway_calls_in_flight") == 0
    refused = [line for line in lines(buffer) if line.get("code") == "budget_exhausted"]
    assert len(refused) == 1, lines(buffer)
    assert refused[0]["level"] == "info"
    assert (refused[0]["identity"], refused[0]["run"], refused[0]["tenant"]) == ("ops-bot", "run-7", "acme")


async def test_made_up_tool_names_share_one_label() -> None:
    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        async with connect(url, TOKENS["ops-bot"]) as c:
            for i in range(200):
                with pytest.raises(MCPError, match="Unknown tool"):
                    await c.call_tool(f"made_up_{i}", {})
            await c.call_tool("lookup_order", {"order_id": "A-1"})
        samples = await scrape(metrics_url(url))
    tools = {s["tool"] for s in series(samples, CALLS)}
    assert tools == {"unknown", "lookup_order"}
    assert value(samples, CALLS, tool="unknown", outcome="error") == 200
    assert len(samples) < 150  # nothing grew with the names


async def test_a_stop_moves_active_stops_propagation_and_refusals(tmp_path: Path) -> None:
    async with running_upstream() as (_, up), control_plane(tmp_path / "c.db") as cp:
        async with running_gateway(gateway_config(up, cp)) as (_, url):
            before = await scrape(metrics_url(url))
            assert value(before, "haltwire_gateway_watch_current") == 1
            assert value(before, "haltwire_gateway_active_stops", kind="agent") == 0
            await issue(cp, "agent:ops-bot")

            async def applied() -> bool:
                now = await scrape(metrics_url(url))
                return value(now, "haltwire_gateway_active_stops", kind="agent") == 1

            await until(applied)
            async with connect(url, TOKENS["ops-bot"]) as c:
                assert (await c.call_tool("lookup_order", {"order_id": "A-1"})).is_error
            after = await scrape(metrics_url(url))
    assert value(after, "haltwire_gateway_stop_propagation_seconds_count") == 1
    assert value(after, "haltwire_gateway_stop_propagation_seconds_sum") < 5
    assert value(after, "haltwire_gateway_refusals_total", code="stopped", retryable="false") == 1
    assert 0 <= value(after, "haltwire_gateway_watch_staleness_seconds") < 5
    assert value(after, "haltwire_gateway_active_stops", kind="tenant") == 0


async def test_metrics_need_no_token_and_count_the_edges_refusals() -> None:
    async with running_upstream() as (_, up), running_gateway(config_dict(up)) as (_, url):
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401
        samples = await scrape(metrics_url(url))
    assert value(samples, "haltwire_gateway_refusals_total", code="unauthenticated", retryable="false") == 1
    assert value(samples, "haltwire_gateway_calls_in_flight") == 0


async def test_the_control_planes_metrics_move_with_a_stop_an_intent_and_a_lease(tmp_path: Path) -> None:
    async with control_with_admin(runs_config(sqlite(tmp_path), True)) as (agents, admin):
        async with httpx2.AsyncClient(base_url=agents, timeout=10) as http:
            run = (await register(http))["run"]["run_id"]
            await propose(http, "k-1")
            await propose(http, "k-2", agent="other-agent")
        await issue(admin, "agent:a1")  # cancels a1's pending intent
        async with httpx2.AsyncClient(base_url=admin, timeout=10) as http:
            r = await http.post(f"/v1/runs/{run}/lease", headers=auth("agent"))
            fired: dict[str, object] = {"firing_id": "f-1", "rule": "r", "kind": "steps"}
            fired |= {"scope": "tenant:acme", "reason": "would stop", "fired_at": 1.0}
            for _ in range(2):  # the same firing twice: recorded, and counted, once
                answer = await http.post("/v1/tripwire-firings", json=fired, headers=auth("tripwire"))
                assert answer.status_code == 200, answer.text
        async with httpx2.AsyncClient(base_url=agents, timeout=10) as http:
            stopped = await http.post(f"/v1/runs/{run}/lease", headers=auth("agent"))
            assert stopped.json()["error"]["code"] == "stopped", stopped.text
            refused_on_agents = await http.get("/metrics", headers=auth("viewer"))
        samples = await scrape(f"{admin}/metrics", auth("viewer"))
        async with httpx2.AsyncClient(base_url=admin, timeout=10) as http:
            head = (await http.get("/v1/audit/head", headers=auth("operator"))).json()
            as_agent = await http.get("/metrics", headers=auth("agent"))
            anonymous = await http.get("/metrics")
    assert r.status_code == 403  # an agent's token on the admin listener
    assert refused_on_agents.status_code == 404, "served on the admin listener only"
    assert as_agent.status_code == 403 and anonymous.status_code == 401
    assert value(samples, "haltwire_control_stops_issued_total", kind="agent") == 1
    assert value(samples, "haltwire_control_stops_cleared_total", kind="agent") == 0
    assert value(samples, "haltwire_control_active_stops", kind="agent") == 1
    assert value(samples, "haltwire_control_intents", state="cancelled") == 1
    assert value(samples, "haltwire_control_intents", state="pending") == 1
    assert value(samples, "haltwire_control_leases_total", result="granted") == 1  # the registration's
    assert value(samples, "haltwire_control_leases_total", result="refused") == 1
    assert value(samples, "haltwire_control_audit_records_total") == head["seq"] >= 4
    assert value(samples, "haltwire_control_tripwire_firings_total") == 1


async def test_failing_closed_is_logged_once_when_it_starts_and_once_when_it_ends(tmp_path: Path) -> None:
    async with running_upstream() as (_, up), control_plane(tmp_path / "c.db") as cp:
        async with TcpProxy.running(int(cp.rsplit(":", 1)[1])) as proxy:
            async with running_gateway(gateway_config(up, proxy.url)) as (_, url):
                async with connect(url, TOKENS["ops-bot"]) as c:
                    with json_log("warning") as buffer:
                        proxy.block()  # silence: no event, no heartbeat

                        async def refused() -> bool:
                            return await code_of(c) == "registry_unreachable"

                        await until(refused)
                        codes = [await code_of(c) for _ in range(20)]
                        stale = [line["message"] for line in lines(buffer)]
                        proxy.unblock()
                        proxy.cut()  # the silent connection is dropped; the watch reconnects

                        async def served() -> bool:
                            return await code_of(c) is None

                        await until(served, within=15)
                        await code_of(c)
                    warnings = [line["message"] for line in lines(buffer) if line["level"] == "warning"]
    assert codes == ["registry_unreachable"] * 20
    assert sum("stops stale" in m for m in stale) == 1, stale
    assert sum("stops stale" in m for m in warnings) == 1, warnings
    assert sum("stops current again" in m for m in warnings) == 1, warnings


async def test_the_executors_metrics_count_what_became_of_its_intents(tmp_path: Path) -> None:
    async with control_plane_for_executor(tmp_path / "control.db") as cp, shop(tmp_path) as (_, up):
        await propose_intent(cp, "k-1", order="A-1001")
        await propose_intent(cp, "k-2", order="A-1002", run="r-2")
        await issue(cp, "run:r-2")  # k-2 is cancelled before anyone claims it
        await propose_intent(cp, "k-3", order="A-1003")
        config = executor_gateway_config(up, cp)
        config["executor"]["metrics_port"] = 0
        async with executor(config) as ex:
            await settled(cp, 3)
            assert ex.metrics_url is not None
            samples = await scrape(ex.metrics_url)
            async with httpx2.AsyncClient(timeout=5) as http:
                assert (await http.get(ex.metrics_url.removesuffix("metrics") + "other")).status_code == 404
    intents = "haltwire_executor_intents_total"
    assert value(samples, intents, state="claimed") == 2
    assert value(samples, intents, state="committed") == 2
    assert value(samples, intents, state="cancelled") == 0  # cancelled at the control plane, never claimed
    assert value(samples, "haltwire_executor_call_duration_seconds_count") == 2


async def test_the_egress_proxys_metrics_count_connections_refusals_and_open_tunnels(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as cp, http_target() as web:
        config = egress_config(cp, {"web": [f"127.0.0.1:{web}"]}, {"ops-bot": "web"})
        config["egress"]["metrics_port"] = 0
        async with running_egress(config) as (proxy, port):
            scraped = proxy.metrics_url
            assert scraped is not None
            token = basic("run-1", mint("run-1", generation=10**6))
            stream, answer = await connect_via(port, f"127.0.0.1:{web}", token)
            async with stream:
                assert answer.status == 200
                open_now = await scrape(scraped)
            denied = await connect_via(port, "127.0.0.1:9", token)
            await denied[0].aclose()
            anonymous = await connect_via(port, f"127.0.0.1:{web}", None)
            await anonymous[0].aclose()

            async def closed() -> bool:
                return value(await scrape(scraped), "haltwire_egress_open_tunnels") == 0

            await until(closed)
            samples = await scrape(scraped)
    assert (denied[1].status, anonymous[1].status) == (403, 407)
    assert value(open_now, "haltwire_egress_open_tunnels") == 1
    assert value(samples, "haltwire_egress_connections_total", outcome="relayed") == 1
    assert value(samples, "haltwire_egress_connections_total", outcome="refused") == 2
    refusals = "haltwire_egress_refusals_total"
    assert value(samples, refusals, code="egress_denied", retryable="false") == 1
    assert value(samples, refusals, code="proxy_auth_required", retryable="false") == 1


async def test_the_gateway_command_logs_json_lines_an_access_log_and_its_refusals(tmp_path: Path) -> None:
    port = free_port()
    async with running_upstream() as (_, up):
        data = config_dict(up, limits={"budget": 1})
        data["gateway"]["port"] = port
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(data))
        command = [sys.executable, "-m", "haltwire", "gateway", "--config", str(path)]
        command += ["--log-format", "json", "--access-log"]
        async with await anyio.open_process(command, stderr=subprocess.PIPE) as proc:
            url = f"http://127.0.0.1:{port}"

            async def ready() -> bool:
                try:
                    async with httpx2.AsyncClient(timeout=2) as http:
                        # Said by the client, not where it connects from: never logged as its address.
                        spoofed = {"x-forwarded-for": "203.0.113.9", "x-forwarded-proto": "https"}
                        return (await http.get(f"{url}/readyz", headers=spoofed)).status_code == 200
                except httpx2.HTTPError:
                    return False

            await until(ready, within=30)
            async with connect(f"{url}/mcp", TOKENS["ops-bot"]) as c:
                assert await code_of(c) is None
                assert await code_of(c) == "budget_exhausted"
            proc.send_signal(signal.SIGTERM)
            assert proc.stderr is not None
            err = b""
            async for chunk in proc.stderr:
                err += chunk
            assert await proc.wait() == 0
    logged = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert logged, err.decode()
    refusal = [line for line in logged if line.get("code") == "budget_exhausted"]
    assert [(r["identity"], r["level"], r["run"]) for r in refusal] == [("ops-bot", "info", None)]
    access = [line for line in logged if line["logger"] == "haltwire.access"]
    assert {(a["method"], a["path"], a["status"]) for a in access} >= {("POST", "/mcp", 200), ("GET", "/readyz", 200)}
    assert all(isinstance(a["duration_ms"], float) for a in access)
    assert {a["client"].rpartition(":")[0] for a in access} == {"127.0.0.1"}, access


def test_an_exporter_that_is_not_installed_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    data = config_dict("http://127.0.0.1:9", tracing={"enabled": True, "exporter": "otlp"})
    path.write_text(tomli_w.dumps(data))
    done = run_haltwire("gateway", "--config", str(path))
    assert done.returncode == 2, done.stderr
    assert "opentelemetry-exporter-otlp-proto-http" in done.stderr and "Traceback" not in done.stderr


async def test_the_admin_listener_counts_the_leases_the_agents_process_grants(tmp_path: Path) -> None:
    command = ControlCommand(tmp_path, sqlite(tmp_path))
    data = tomllib.loads(command.config.read_text())
    data["leases"] = runs_config(sqlite(tmp_path))["leases"]
    command.config.write_text(tomli_w.dumps(data))
    metrics = f"{command.url('admin')}/metrics"
    try:
        await command.start()
        async with httpx2.AsyncClient(base_url=command.url("agents"), timeout=10) as http:
            await register(http)
            first = await scrape(metrics, auth("viewer"))
            os.kill(command.children()[0], signal.SIGKILL)  # the main process starts another

            async def replaced() -> bool:
                if len(command.children()) < 2:
                    return False
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx2.TransportError:
                    return False

            await until(replaced, within=20)
            await register(http)
        second = await scrape(metrics, auth("viewer"))
    finally:
        await stopped(command)
    granted = "haltwire_control_leases_total"
    assert value(first, granted, result="granted") == 1
    assert value(second, granted, result="granted") == 2, "a new child counts on from the last"
