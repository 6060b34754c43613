"""The egress proxy with the runtime SDK and the broker (issue 15): a run's proxy environment,
renewed with its lease, used by real subprocesses (curl); broker credentials as proxy
credentials, stopped and fenced as at the gateway.

A real control plane (SQLite) grants the leases and the credentials; the proxy runs in-process
and follows it; the target is an HTTP server on loopback, allowed by address.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest

from control_harness import TOKEN
from egress_harness import (
    EGRESS_AUDIENCE,
    basic,
    connect_via,
    curl,
    curl_with_env,
    echo_target,
    http_target,
    leasing_plane,
    plane_egress_config,
    running_egress,
)
from haltwire.runtime import ControlClient, Lease, StopRequested
from leases_harness import GatewayClock
from stops_harness import clear, issue, until

pytestmark = pytest.mark.anyio


async def test_a_runs_subprocess_goes_out_with_the_current_token_and_not_after_a_stop(tmp_path: Path) -> None:
    async with (
        leasing_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        running_egress(plane_egress_config(cp, [f"127.0.0.1:{web}"])) as (_, port),
    ):
        proxy, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{web}/from-a-subprocess"
        env: dict[str, str] = {}
        async with Lease.start(ControlClient(cp, TOKEN["agent"]), agent_class="fast") as lease:
            assert lease.proxy_env(proxy) == lease.proxy_env(proxy, no_proxy="")
            lease.export_proxy_env(proxy, environ=env)
            assert env["HTTPS_PROXY"] == env["http_proxy"] == f"http://{lease.run_id}:{lease.token}@127.0.0.1:{port}"
            assert env["NO_PROXY"] == env["no_proxy"] == ""
            served = await curl_with_env(env, url)
            assert (served.status, served.body) == (200, b"hello from target /from-a-subprocess")

            # Renewed (the fast class renews every second): the environment carries the new token.
            first = dict(env)
            with anyio.fail_after(5):
                while env == first:
                    await anyio.sleep(0.05)
            assert lease.token in env["HTTP_PROXY"] and lease.token in env["https_proxy"]
            assert (await curl_with_env(env, url)).status == 200
            # A subprocess still holding the old token is served until that token's own expiry.
            assert (await curl_with_env(first, url)).status == 200

            stop = await issue(cp, f"run:{lease.run_id}", "exfiltration")
            for held in (env, first):  # the current token and the old one alike
                async def refused(held: dict[str, str] = held) -> bool:
                    answer = await curl_with_env(held, url)
                    return answer.status == 403 and answer.error["code"] == "stopped"

                await until(refused)
            with anyio.fail_after(5):
                await lease.ended.wait()
            with pytest.raises(StopRequested):
                lease.proxy_env(proxy)
            # Cleared, the run's tokens stay fenced: a stop is final for a run.
            await clear(cp, stop["stop_id"])

            async def fenced() -> bool:
                answer = await curl_with_env(env, url)
                return answer.status == 403 and answer.error["code"] == "lease_invalid"

            await until(fenced)


async def _credential(cp: str, run_id: str, audience: str = EGRESS_AUDIENCE) -> str:
    async with httpx2.AsyncClient(base_url=cp, timeout=10) as http:
        r = await http.post(
            f"/v1/runs/{run_id}/credentials",
            json={"audience": audience},
            headers={"Authorization": f"Bearer {TOKEN['agent']}"},
        )
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


async def test_a_broker_credential_is_a_proxy_credential_stopped_and_fenced_as_a_lease(tmp_path: Path) -> None:
    clock = GatewayClock()
    async with (
        leasing_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        echo_target() as echo,
        running_egress(
            plane_egress_config(cp, [f"127.0.0.1:{web}", f"127.0.0.1:{echo.port}"], broker=True), clock=clock
        ) as (_, port),
    ):
        proxy, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{web}/brokered"
        control = ControlClient(cp, TOKEN["agent"])
        lease = await Lease.register(control)
        credential = await _credential(cp, lease.run_id)
        served = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{credential}", url)
        assert (served.status, served.body) == (200, b"hello from target /brokered")
        bearer = await curl("-x", proxy, "--proxy-header", f"Proxy-Authorization: Bearer {credential}", url)
        assert bearer.status == 200
        # The lease token works beside it; a credential for another audience does not.
        assert (await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{lease.token}", url)).status == 200
        foreign = await _credential(cp, lease.run_id, "orders")
        wrong = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{foreign}", url)
        assert wrong.status == 407 and wrong.error["code"] == "unauthenticated"
        assert "audience" in wrong.error["message"].lower()
        tampered = credential[:-4] + ("AAAA" if not credential.endswith("AAAA") else "BBBB")
        forged = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{tampered}", url)
        assert forged.status == 407 and forged.error["code"] == "unauthenticated"
        # Expired by the proxy's clock (the broker's ttl is 600 s), with no leeway.
        clock.offset = 601.0
        expired = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{credential}", url)
        assert expired.status == 407 and expired.error["code"] == "unauthenticated"
        assert "expired" in expired.error["message"]
        clock.offset = 0.0

        # A tunnel opened with the credential is the run's: a stop on the run closes it.
        tunnel, answer = await connect_via(port, f"127.0.0.1:{echo.port}", basic(lease.run_id, credential))
        assert answer.status == 200
        await tunnel.send(b"ping")
        assert await tunnel.receive() == b"ping"
        stop = await issue(cp, f"run:{lease.run_id}", "loops")
        await echo.until_closed(1, within=2)
        with anyio.fail_after(2), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await tunnel.receive()
        await tunnel.aclose()

        async def stopped() -> bool:
            answer = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{credential}", url)
            return answer.status == 403 and answer.error["code"] == "stopped"

        await until(stopped)
        await clear(cp, stop["stop_id"])

        async def fenced() -> bool:
            answer = await curl("-x", proxy, "--proxy-user", f"{lease.run_id}:{credential}", url)
            return answer.status == 403 and answer.error["code"] == "lease_invalid"

        await until(fenced)
