"""The runtime SDK (levels 1 and 2) against a real control plane, gateway, upstream and MCP client.

The ``fast`` agent class (ttl 3 s, renew every 1 s, give up after 2 s) keeps the bounds short.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from control_harness import TOKEN
from haltwire.control import create_app, parse_control_config
from haltwire.runtime import (
    ControlClient,
    Guard,
    Lease,
    LeasedTools,
    LeasePool,
    StopRequested,
)
from haltwire.serve import serving
from harness import config_dict, connect, running_gateway, running_upstream
from runs_harness import LEASES
from runs_harness import config_dict as control_config
from tcp_proxy import TcpProxy

pytestmark = pytest.mark.anyio

#: The control plane's identity for the gateway's ops-bot (same agent, tenant and version).
OPS = {
    "name": "ops-runtime",
    "role": "agent",
    "token": "tok-ops-rt",
    "agent": "ops-bot",
    "tenant": "acme",
    "version": "1.0",
}
HEARTBEAT_S = 0.2


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def control_plane(db: Path, port: int = 0) -> AsyncIterator[str]:
    data = control_config({"backend": "sqlite", "path": str(db)})
    data["control"]["heartbeat_s"] = HEARTBEAT_S
    data["identities"].append(OPS)
    data["broker"] = {"ttl_s": 600, "audiences": ["orders"], "generate": True}
    async with serving(create_app(parse_control_config(data)), port=port, graceful_s=1) as url:
        yield url


@asynccontextmanager
async def stoppable_plane(db: Path) -> AsyncIterator[tuple[str, Callable[[], Awaitable[None]]]]:
    """A control plane in a task of its own, so the test can take it away mid-run."""
    gone, done = anyio.Event(), anyio.Event()

    async def run(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with control_plane(db) as url:
            task_status.started(url)
            await gone.wait()
        done.set()

    async def shut_down() -> None:
        gone.set()
        await done.wait()

    async with anyio.create_task_group() as tg:
        url: str = await tg.start(run)
        yield url, shut_down
        gone.set()


async def operator(url: str, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=url, timeout=10) as http:
        r = await http.request(
            method, path, json=body, headers={"Authorization": f"Bearer {TOKEN['operator']}"}
        )
    assert r.status_code in (200, 201), r.text
    out: dict[str, Any] = r.json()
    return out


async def stop(url: str, scope: str) -> dict[str, Any]:
    return await operator(url, "POST", "/v1/stops", {"scope": scope, "reason": "refund storm"})


async def clear(url: str, stop_id: str) -> None:
    await operator(url, "POST", f"/v1/stops/{stop_id}/clear", {"reason": "injection removed"})


def agent(url: str) -> ControlClient:
    return ControlClient(url, OPS["token"], timeout_s=2)


async def ended_within(lease: Lease, seconds: float) -> float:
    """Seconds until the lease ended; fails after ``seconds``."""
    started = time.monotonic()
    with anyio.fail_after(seconds):
        await lease.ended.wait()
    return time.monotonic() - started


# -- level 1: the lease ------------------------------------------------------------------------


async def test_the_lease_renews_and_a_run_stop_ends_it(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control, agent_class="fast") as lease:
            first = lease.require()
            await anyio.sleep(2.5)  # past renew_timeout_s: only renewals keep it alive
            assert lease.require() != first, "renewed: a newer token"
            issued = await stop(url, f"run:{lease.run_id}")
            # Push or the next renewal, whichever comes first (push alone: the tests below).
            await ended_within(lease, 2.0)
            with pytest.raises(StopRequested) as exc:
                lease.require()
            assert exc.value.notice.code == "stopped"
            assert exc.value.notice.stop_id == issued["stop_id"]


@pytest.mark.parametrize("scope", ["run", "tenant:acme", "version:ops-bot@1.0", "agent:ops-bot", "global"])
async def test_push_ends_the_lease_for_every_scope_that_covers_the_run(tmp_path: Path, scope: str) -> None:
    # The default class renews every 5 s: ending within 2 s can only be the push.
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control) as lease:
            await stop(url, "tenant:other")  # not this run's: pushed to no one here
            await stop(url, "run:someone-elses-run")
            await anyio.sleep(0.3)
            assert lease.require()
            issued = await stop(url, f"run:{lease.run_id}" if scope == "run" else scope)
            await ended_within(lease, 2.0)
            assert lease.notice is not None and lease.notice.stop_id == issued["stop_id"]


async def test_without_push_the_refused_renewal_ends_the_lease(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control, agent_class="fast", push=False) as lease:
            issued = await stop(url, "tenant:acme")
            await ended_within(lease, 1.0 + 1.5)  # one renewal interval, plus slack
            assert lease.notice is not None and lease.notice.stop_id == issued["stop_id"]
            assert lease.notice.code == "stopped"


async def test_a_registration_under_a_stop_is_refused_with_the_stop(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        issued = await stop(url, "agent:ops-bot")
        with pytest.raises(StopRequested) as exc:
            async with Lease.start(control, agent_class="fast"):
                pass
        assert exc.value.notice.stop_id == issued["stop_id"]


async def test_expiry_is_judged_on_the_local_monotonic_clock_from_the_request(tmp_path: Path) -> None:
    clock = Clock()
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control, agent_class="fast", monotonic=clock, push=False) as lease:
            # No await below: the renewal task cannot run, so only the local clock moves.
            clock.now += 1.9
            assert lease.require(), "still inside renew_timeout_s (2 s) from the grant's request"
            clock.now += 0.1
            with pytest.raises(StopRequested) as exc:
                lease.require()
            assert exc.value.notice.code == "lease_expired"


async def test_a_control_plane_gone_ends_every_lease_within_renew_timeout(tmp_path: Path) -> None:
    async with stoppable_plane(tmp_path / "c.db") as (url, shut_down):
        async with agent(url) as control, Lease.start(control, agent_class="fast", push=False) as lease:
            await anyio.sleep(1.2)  # one renewal has happened
            assert lease.require()
            await shut_down()  # the control plane is gone: connections are refused
            took = await ended_within(lease, 2.0 + 1.5)
            assert lease.notice is not None and lease.notice.code == "lease_expired"
            assert took <= 2.0 + 1.5


# -- level 2 and 3: the guard, and the gateway ---------------------------------------------------


def gateway_with(upstream: str, control: str) -> dict[str, Any]:
    link = {"url": control, "token": TOKEN["gateway"], "staleness_s": 2.0}
    return config_dict(upstream, control=link, leases={"keys": LEASES["keys"]})


def bounded_sleep(data: dict[str, Any]) -> dict[str, Any]:
    """``sleep`` labelled bounded: the gateway lets it finish when a stop comes (level 3 cuts only
    cancellable calls in flight, test_inflight_stops.py), so a cut seen is the runtime's (level 2)."""
    data["upstreams"][0]["labels"] = {"sleep": "bounded"}
    return data


async def test_a_stop_cancels_the_tool_call_in_flight_and_the_upstream_sees_it(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "c.db") as url,
        running_upstream() as (demo, up),
        running_gateway(bounded_sleep(gateway_with(up, url))) as (_, mcp_url),
        agent(url) as control,
        Lease.start(control, agent_class="fast") as lease,
        connect(mcp_url, "tok-ops") as client,
    ):
        tools = LeasedTools(client, Guard(lease))
        served = await tools.call_tool("lookup_order", {"order_id": "A-1"})
        assert not served.is_error

        async def stop_soon() -> None:
            await anyio.sleep(0.5)
            await stop(url, f"run:{lease.run_id}")

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_soon)
            with pytest.raises(StopRequested):
                await tools.call_tool("sleep", {"seconds": 30})
        assert time.monotonic() - started < 5, "cancelled long before the 30 s call would end"
        with anyio.fail_after(5):
            while demo.cancelled["sleep"] < 1:
                await anyio.sleep(0.05)
        with pytest.raises(StopRequested):
            await tools.call_tool("lookup_order", {"order_id": "A-2"})  # level 1: not even sent


async def test_a_runtime_that_never_checks_is_stopped_at_the_gateway(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "c.db") as url,
        running_upstream() as (demo, up),
        running_gateway(gateway_with(up, url)) as (_, mcp_url),
        agent(url) as control,
        Lease.start(control, agent_class="fast", push=False) as lease,
        connect(mcp_url, "tok-ops") as client,
    ):
        token = lease.token  # taken once; this runtime never calls require() again
        meta: Any = {"io.haltwire/lease": token}

        async def code() -> str | None:
            result = await client.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)
            error = (result.structured_content or {}).get("error", {}) if result.is_error else {}
            return error.get("code")

        assert await code() is None
        issued = await stop(url, f"run:{lease.run_id}")
        with anyio.fail_after(2):  # push to the gateway: the propagation bound, generously
            while await code() != "stopped":
                await anyio.sleep(0.02)
        await clear(url, issued["stop_id"])
        # The clear does not revive a lease granted before the stop: fenced.
        with anyio.fail_after(2):
            while await code() != "lease_invalid":
                await anyio.sleep(0.02)


async def test_a_new_run_resumes_from_the_stopped_runs_checkpoint(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control, agent_class="fast") as lease:
            await lease.save_checkpoint({"next_order": "A-7", "refunded": ["A-1"]})
            issued = await stop(url, f"run:{lease.run_id}")
            await ended_within(lease, 2)
            old = lease.run_id
        await clear(url, issued["stop_id"])
        async with Lease.start(control, agent_class="fast", resume_from=old) as resumed:
            assert resumed.run_id != old
            assert resumed.checkpoint is not None
            assert resumed.checkpoint["data"] == {"next_order": "A-7", "refunded": ["A-1"]}
            assert resumed.require()


async def test_with_the_control_plane_gone_a_runtime_that_never_checks_is_refused_within_one_ttl(
    tmp_path: Path,
) -> None:
    # A gateway that verifies leases but follows no control plane: the lease is the only bound.
    async with (
        stoppable_plane(tmp_path / "c.db") as (url, shut_down),
        running_upstream() as (_, up),
        running_gateway(config_dict(up, leases={"keys": LEASES["keys"]})) as (_, mcp_url),
        connect(mcp_url, "tok-ops") as client,
    ):
        async with agent(url) as control, Lease.start(control, agent_class="fast", push=False) as lease:
            meta: Any = {"io.haltwire/lease": lease.token}
            ttl_ends = time.time() + 3.0  # the fast class's ttl_s from (about) now
            await shut_down()
            result = await client.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)
            assert not result.is_error, "inside its ttl the token is still good"
            with anyio.fail_after(3.0 + 2.0):
                while not (
                    result := await client.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)
                ).is_error:
                    await anyio.sleep(0.05)
            refused_at = time.time()
            assert (result.structured_content or {})["error"]["code"] == "lease_expired"
            assert refused_at <= ttl_ends + 1.0


# -- many runs in one runtime -------------------------------------------------------------------


class CountingClient(ControlClient):
    """The real client, counting the renewal requests it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url, OPS["token"], timeout_s=2)
        self.single = self.batches = 0

    async def renew(self, run_id: str) -> Any:
        self.single += 1
        return await super().renew(run_id)

    async def renew_many(self, run_ids: Sequence[str]) -> Any:
        self.batches += 1
        return await super().renew_many(run_ids)


async def test_a_pool_renews_many_runs_in_one_request_and_a_stop_ends_exactly_its_runs(
    tmp_path: Path,
) -> None:
    async with (
        control_plane(tmp_path / "c.db") as url,
        CountingClient(url) as counting,
        LeasePool.open(counting) as pool,
    ):
        control = counting
        leases = [await pool.start_run(agent_class="fast") for _ in range(30)]
        tokens = [lease.require() for lease in leases]
        await anyio.sleep(2.6)  # past renew_timeout_s: only renewals keep them alive
        assert all(lease.require() != token for lease, token in zip(leases, tokens, strict=True))
        # One request per interval for all 30 runs (registering them spans a few intervals).
        assert control.single == 0 and 2 <= control.batches < 10

        one = await stop(url, f"run:{leases[0].run_id}")
        await ended_within(leases[0], 2.0)
        assert leases[0].notice is not None and leases[0].notice.stop_id == one["stop_id"]
        assert all(lease.notice is None for lease in leases[1:])
        assert len(pool) == 29

        everyone = await stop(url, "tenant:acme")
        for lease in leases[1:]:
            await ended_within(lease, 2.0)
            assert lease.notice is not None and lease.notice.stop_id == everyone["stop_id"]
        assert len(pool) == 0


async def test_a_pool_whose_control_plane_is_gone_ends_every_run_within_renew_timeout(tmp_path: Path) -> None:
    async with stoppable_plane(tmp_path / "c.db") as (url, shut_down):
        async with agent(url) as control, LeasePool.open(control, push=False) as pool:
            leases = [await pool.start_run(agent_class="fast") for _ in range(10)]
            await anyio.sleep(1.2)
            await shut_down()
            for lease in leases:
                await ended_within(lease, 2.0 + 1.5)
                assert lease.notice is not None and lease.notice.code == "lease_expired"


async def test_a_blocked_control_port_ends_the_lease_within_renew_timeout(tmp_path: Path) -> None:
    # Silence, not refusal: every renewal hangs until the runtime abandons it.
    async with (
        control_plane(tmp_path / "c.db") as url,
        TcpProxy.running(int(url.rsplit(":", 1)[1])) as proxy,
        agent(proxy.url) as control,
        Lease.start(control, agent_class="fast", push=False) as lease,
    ):
        await anyio.sleep(1.2)
        assert lease.require()
        proxy.block()
        took = await ended_within(lease, 2.0 + 1.5)
        assert lease.notice is not None and lease.notice.code == "lease_expired"
        assert took <= 2.0 + 1.5


async def test_without_push_a_runtime_that_never_checks_is_refused_within_one_ttl_of_a_stop(
    tmp_path: Path,
) -> None:
    # The gateway follows no control plane: only the refused renewal, then expiry, stop the run.
    async with (
        control_plane(tmp_path / "c.db") as url,
        running_upstream() as (_, up),
        running_gateway(config_dict(up, leases={"keys": LEASES["keys"]})) as (_, mcp_url),
        connect(mcp_url, "tok-ops") as client,
        agent(url) as control,
        Lease.start(control, agent_class="fast", push=False) as lease,
    ):

        async def refusal() -> str | None:
            meta: Any = {"io.haltwire/lease": lease.token}  # the newest token, never require()
            result = await client.call_tool("lookup_order", {"order_id": "A-1"}, meta=meta)
            return (result.structured_content or {})["error"]["code"] if result.is_error else None

        assert await refusal() is None
        await stop(url, f"run:{lease.run_id}")
        stopped_at = time.monotonic()
        with anyio.fail_after(3.0 + 2.0):  # ttl_s of the fast class, plus slack
            while (code := await refusal()) is None:
                await anyio.sleep(0.05)
        assert code == "lease_expired"
        assert time.monotonic() - stopped_at <= 3.0 + 1.0


async def test_exceptions_come_out_as_themselves_not_as_exception_groups(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        with pytest.raises(StopRequested):  # raised in the block, caught outside it
            async with Lease.start(control, agent_class="fast") as lease:
                await stop(url, f"run:{lease.run_id}")
                await ended_within(lease, 2)
                lease.require()

        async def broken(token: str) -> None:
            raise ValueError("the tool's own failure")

        async with Lease.start(control, agent_class="fast") as lease:
            with pytest.raises(ValueError, match="own failure"):
                await Guard(lease).call(broken)
        with pytest.raises(KeyError):
            async with LeasePool.open(control):
                raise KeyError("the runtime's own bug")


async def test_a_pool_hears_a_stop_by_push_long_before_its_next_renewal(tmp_path: Path) -> None:
    # The default class renews every 5 s: ending within 2 s can only be the pool's watch.
    async with (
        control_plane(tmp_path / "c.db") as url,
        agent(url) as control,
        LeasePool.open(control) as pool,
    ):
        leases = [await pool.start_run() for _ in range(5)]
        issued = await stop(url, "version:ops-bot@1.0")
        for lease in leases:
            await ended_within(lease, 2.0)
            assert lease.notice is not None and lease.notice.stop_id == issued["stop_id"]


async def test_a_runs_broker_credential_is_reused_and_refused_once_the_run_is_stopped(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "c.db") as url, agent(url) as control:
        async with Lease.start(control, push=False) as lease:
            token = await lease.credential("orders")
            assert await lease.credential("orders") == token, "reused: far from two thirds of its life"
            await stop(url, f"run:{lease.run_id}")
            lease._credentials.clear()  # as if two thirds of its life had passed
            with pytest.raises(StopRequested) as exc:
                await lease.credential("orders")
            assert exc.value.notice.code == "stopped"
            with pytest.raises(StopRequested):
                lease.require()  # the broker's refusal ended the lease too
