"""The egress proxy (issue 15, level 5): real servers on loopback, real clients (curl, httpx2,
raw sockets), a real control plane for stops.

The proxy runs in-process (``EgressProxy``) following a control plane on SQLite; targets are
an HTTP server and a TCP echo server on loopback, allowed by address (loopback is never
reached through a name alone).
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest
import tomli_w

from egress_harness import (
    Answer,
    Echo,
    basic,
    connect_via,
    curl,
    echo_target,
    egress_command,
    egress_config,
    http_target,
    read_head,
    run_command,
    running_egress,
)
from leases_harness import K2, GatewayClock, mint, tamper
from ports import free_port
from stops_harness import STALENESS_S, clear, control_plane, issue, until

pytestmark = pytest.mark.anyio

#: How soon a stop must have closed an open tunnel (the push path: milliseconds; generous here,
#: since other sessions share this machine's two cores).
STOP_BOUND_S = 1.0
LATE = 10**6  # a generation after every stop in these tests


def _profiles(*ports: int) -> dict[str, list[str]]:
    return {"web": [f"127.0.0.1:{p}" for p in ports] + ["localhost:*"]}


async def test_an_allowed_host_is_served_by_forward_and_by_tunnel_with_curl_and_httpx(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        echo_target() as echo,
        running_egress(egress_config(cp, _profiles(web, echo.port), {"ops-bot": "web"})) as (_, port),
    ):
        token = mint("run-1", generation=LATE)
        proxy = f"http://127.0.0.1:{port}"
        url = f"http://127.0.0.1:{web}/hello"
        plain = await curl("-x", proxy, "--proxy-user", f"run-1:{token}", url)
        assert (plain.status, plain.body) == (200, b"hello from target /hello")
        tunnelled = await curl("-p", "-x", proxy, "--proxy-user", f"run-1:{token}", url)
        assert (tunnelled.status, tunnelled.body) == (200, b"hello from target /hello")
        bearer = await curl("-x", proxy, "--proxy-header", f"Proxy-Authorization: Bearer {token}", url)
        assert bearer.status == 200

        async with httpx2.AsyncClient(proxy=f"http://run-1:{token}@127.0.0.1:{port}", timeout=10) as http:
            r = await http.get(f"http://127.0.0.1:{web}/via-httpx", params={"q": "1"})
            assert (r.status_code, r.text) == (200, "hello from target /via-httpx")
            r = await http.post(f"http://127.0.0.1:{web}/length", content=b"x" * 300_000)
            assert (r.status_code, r.text) == (200, "300000")  # the body streamed through
            seen = (
                await http.get(f"http://127.0.0.1:{web}/headers", headers={"Connection": "X-Secret"})
            ).json()
            # The lease token is the proxy's credential: the target never sees it, nor hop-by-hop headers.
            assert "proxy-authorization" not in seen and token not in str(seen)
            assert seen["host"] == f"127.0.0.1:{web}" and seen["connection"] == "close"
        # curl waits for "100 Continue" before a large body: the proxy passes it on.
        body = tmp_path / "body.bin"
        body.write_bytes(b"y" * 2_000_000)
        continued = await curl(
            "-x", proxy, "--proxy-user", f"run-1:{token}", "-H", "Expect: 100-continue",
            "--data-binary", f"@{body}", f"http://127.0.0.1:{web}/length",
        )  # fmt: skip
        assert (continued.status, continued.body) == (200, b"2000000")

        stream, answer = await connect_via(port, f"127.0.0.1:{echo.port}", basic("run-1", token))
        assert answer.status == 200
        async with stream:
            await stream.send(b"ping")
            assert await stream.receive() == b"ping"
        await echo.until_closed(1, within=5)


async def test_what_is_not_allowed_is_refused_with_a_clear_body(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        echo_target() as echo,
        running_egress(
            egress_config(
                cp, {"web": [f"127.0.0.1:{web}", f"[::1]:{web}", "localhost:*"]}, {"ops-bot": "web"}
            )
        ) as (_, port),
    ):
        proxy, auth = f"http://127.0.0.1:{port}", f"run-1:{mint('run-1', generation=LATE)}"

        other_port = await curl("-x", proxy, "--proxy-user", auth, f"http://127.0.0.1:{echo.port}/")
        assert other_port.status == 403 and other_port.error["code"] == "egress_denied"
        assert f"127.0.0.1:{echo.port}" in other_port.error["message"]
        assert other_port.error["retryable"] is False and other_port.error["profile"] == "web"

        # A name that is allowed, but resolves to loopback, which the profile lists only on one port.
        by_name = await curl("-x", proxy, "--proxy-user", auth, f"http://localhost:{echo.port}/")
        assert by_name.status == 403 and by_name.error["code"] == "egress_denied"
        assert "non-public address" in by_name.error["message"]
        assert by_name.error["address"] in ("127.0.0.1", "::1")
        # The same name on the listed port reaches its listed addresses (every address checked).
        assert (await curl("-x", proxy, "--proxy-user", auth, f"http://localhost:{web}/")).status == 200

        unknown = await curl("-x", proxy, "--proxy-user", auth, "http://no-such-host.example:80/")
        assert unknown.status == 403 and unknown.error["code"] == "egress_denied"

        # An agent with no profile gets "none": nothing at all.
        nobody = mint("run-b", "billing-bot", generation=LATE)
        none = await curl("-x", proxy, "--proxy-user", f"run-b:{nobody}", f"http://127.0.0.1:{web}/")
        assert (
            none.status == 403 and none.error["code"] == "egress_denied" and none.error["profile"] == "none"
        )

        # A tunnel to a port not allowed is refused before anything is connected.
        stream, answer = await connect_via(
            port, f"127.0.0.1:{echo.port}", basic("run-1", auth.split(":", 1)[1])
        )
        await stream.aclose()
        assert answer.status == 403 and answer.error["code"] == "egress_denied"
        assert echo.opened == 0

        # Not a proxy request: origin form, and an https:// URI (clients tunnel those).
        origin = await curl(f"http://127.0.0.1:{port}/just-a-path")
        assert origin.status == 400 and origin.error["code"] == "proxy_request_invalid"


async def test_no_credentials_or_bad_ones_get_407_and_stopped_ones_403(tmp_path: Path) -> None:
    clock = GatewayClock()
    async with (
        control_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        running_egress(egress_config(cp, _profiles(web), {"ops-bot": "web"}), clock=clock) as (_, port),
    ):
        proxy, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{web}/"
        good = mint("run-1", generation=LATE)

        async def with_header(value: str) -> Answer:
            return await curl("-x", proxy, "--proxy-header", f"Proxy-Authorization: {value}", url)

        missing = await curl("-x", proxy, url)
        assert missing.status == 407 and missing.error["code"] == "proxy_auth_required"
        assert missing.headers["proxy-authenticate"].startswith("Basic realm=")
        for bad in ("Basic !!!not-base64", "Digest abc", "Basic " + "cnVuLTE=", "Bearer"):
            answer = await with_header(bad)
            assert answer.status == 407 and answer.error["code"] == "proxy_auth_required", bad

        forged_keys = mint("run-1", keys=K2)
        for what, token in {
            "unknown key": forged_keys,
            "tampered": tamper(good, run="run-2"),
            "not a token": "garbage",
        }.items():
            answer = await curl("-x", proxy, "--proxy-user", f"run-1:{token}", url)
            assert answer.status == 407 and answer.error["code"] == "lease_invalid", what
            assert "proxy-authenticate" in answer.headers

        # Expiry by the proxy's clock, with no leeway.
        clock.offset = 59.0
        assert (await curl("-x", proxy, "--proxy-user", f"run-1:{good}", url)).status == 200
        clock.offset = 60.5
        expired = await curl("-x", proxy, "--proxy-user", f"run-1:{good}", url)
        assert expired.status == 407 and expired.error["code"] == "lease_expired"
        assert "run-1" in expired.error["message"]
        clock.offset = 0.0

        # A stop on the run: 403 stopped; cleared, the old lease stays fenced (lease_invalid).
        old = mint("run-1", generation=0)
        assert (await curl("-x", proxy, "--proxy-user", f"run-1:{old}", url)).status == 200
        stop = await issue(cp, "run:run-1", "loops")

        async def stopped() -> bool:
            answer = await curl("-x", proxy, "--proxy-user", f"run-1:{old}", url)
            return answer.status == 403 and answer.error["code"] == "stopped"

        await until(stopped)
        await clear(cp, stop["stop_id"])

        async def fenced() -> bool:
            answer = await curl("-x", proxy, "--proxy-user", f"run-1:{old}", url)
            return answer.status == 403 and answer.error["code"] == "lease_invalid"

        await until(fenced)
        fence = await curl("-x", proxy, "--proxy-user", f"run-1:{old}", url)
        assert "granted before stop" in fence.error["message"]
        # A lease granted at or after the stop's revision is good again; another run never was fenced.
        renewed = mint("run-1", generation=stop["revision"])
        assert (await curl("-x", proxy, "--proxy-user", f"run-1:{renewed}", url)).status == 200
        other = mint("run-2", generation=0)
        assert (await curl("-x", proxy, "--proxy-user", f"run-2:{other}", url)).status == 200


async def _stream_until_closed(stream: anyio.abc.SocketStream) -> float:
    """Keep sending and reading through a tunnel until it ends; answers when (monotonic)."""
    try:
        while True:
            await stream.send(b"x" * 1024)
            await stream.receive()
            await anyio.sleep(0.01)
    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        return time.monotonic()


async def test_a_stop_closes_the_runs_open_tunnels_at_once_and_no_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "haltwire.egress")
    async with (
        control_plane(tmp_path / "control.db") as cp,
        echo_target() as echo,
        running_egress(egress_config(cp, _profiles(echo.port), {"ops-bot": "web"})) as (proxy, port),
    ):
        target = f"127.0.0.1:{echo.port}"
        mine, answer = await connect_via(port, target, basic("run-s", mint("run-s", generation=LATE)))
        assert answer.status == 200
        other, answer = await connect_via(port, target, basic("run-o", mint("run-o", generation=LATE)))
        assert answer.status == 200
        await other.send(b"hi")
        assert await other.receive() == b"hi"
        assert len(proxy.connections.of_run("run-s")) == 1

        ended: list[float] = []
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                ended.append(await _stream_until_closed(mine))

            tg.start_soon(stream)
            await anyio.sleep(0.3)  # data is flowing
            assert echo.received > 0
            issued = time.monotonic()
            stop = await issue(cp, "run:run-s", "exfiltration")
            with anyio.fail_after(STOP_BOUND_S):
                await echo.until_closed(1, within=STOP_BOUND_S)
        assert ended and ended[0] - issued < STOP_BOUND_S, "the client's stream ended"
        await mine.aclose()
        assert proxy.connections.of_run("run-s") == []
        cut = [r.getMessage() for r in caplog.records if "of run run-s" in r.getMessage()]
        assert len(cut) == 1 and f"cut by stop {stop['stop_id']}" in cut[0], cut
        assert re.search(r": [1-9]\d* bytes sent, [1-9]\d* received, \d+\.\d{3} s$", cut[0]), cut[0]

        # The other run's tunnel is untouched, and the stopped run opens no new one.
        await other.send(b"still")
        assert await other.receive() == b"still"
        again, answer = await connect_via(port, target, basic("run-s", mint("run-s", generation=LATE)))
        await again.aclose()
        assert answer.status == 403 and answer.error["code"] == "stopped"
        await other.aclose()


async def test_a_lease_that_runs_out_closes_its_tunnel_at_its_expiry(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        echo_target() as echo,
        running_egress(egress_config(cp, _profiles(echo.port), {"ops-bot": "web"})) as (_, port),
    ):
        token = mint("run-e", generation=LATE, ttl_s=1.5)
        expires = time.time() + 1.5
        stream, answer = await connect_via(port, f"127.0.0.1:{echo.port}", basic("run-e", token))
        assert answer.status == 200
        closed_at = await _stream_until_closed(stream)
        await stream.aclose()
        late_by = time.time() - expires - (time.monotonic() - closed_at)
        assert -0.2 < late_by < 0.5
        await echo.until_closed(1, within=2)


async def test_an_unreachable_control_plane_closes_tunnels_past_the_staleness_bound(tmp_path: Path) -> None:
    async with anyio.create_task_group() as outer:
        # The control plane runs in a task of its own, so that it can go away while the rest stays.
        gone_now = anyio.Event()

        async def control(*, task_status: anyio.abc.TaskStatus[str]) -> None:
            async with control_plane(tmp_path / "control.db") as url:
                task_status.started(url)
                await gone_now.wait()

        cp = await outer.start(control)
        async with (
            echo_target() as echo,
            running_egress(egress_config(cp, _profiles(echo.port), {"ops-bot": "web"})) as (_, port),
        ):
            token = mint("run-u", generation=LATE)
            stream, answer = await connect_via(port, f"127.0.0.1:{echo.port}", basic("run-u", token))
            assert answer.status == 200
            ended: list[float] = []
            async with anyio.create_task_group() as tg:

                async def flow() -> None:
                    ended.append(await _stream_until_closed(stream))

                tg.start_soon(flow)
                await anyio.sleep(0.2)
                gone = time.monotonic()
                gone_now.set()  # its server stops: the watch falls silent
            assert ended and STALENESS_S * 0.5 < ended[0] - gone < STALENESS_S + 2.5
            await echo.until_closed(1, within=2)
            await stream.aclose()

            again, refused = await connect_via(port, f"127.0.0.1:{echo.port}", basic("run-u", token))
            await again.aclose()
            assert refused.status == 503 and refused.error["code"] == "registry_unreachable"
            assert "egress proxy" in refused.error["message"]


async def test_a_slow_or_huge_head_and_connections_past_the_cap_are_closed(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        config = egress_config(cp, {}, {})
        config["egress"] |= {"max_connections": 2, "max_head_bytes": 2048}
        async with running_egress(config) as (_, port):
            # A slowloris: a head that never ends is closed, unanswered, at header_timeout_s (1 s).
            slow = await anyio.connect_tcp("127.0.0.1", port)
            started = time.monotonic()
            await slow.send(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\n")
            second = await anyio.connect_tcp("127.0.0.1", port)
            # Past the cap (two open): closed as it is accepted.
            third = await anyio.connect_tcp("127.0.0.1", port)
            with anyio.fail_after(0.5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await third.receive()
            await third.aclose()
            with anyio.fail_after(3), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                while True:
                    await slow.send(b"X-Slow: 1\r\n")
                    await anyio.sleep(0.1)
                    await slow.receive()  # nothing comes but the end
            assert 0.9 < time.monotonic() - started < 2.5
            await slow.aclose()
            await second.aclose()

            huge = await anyio.connect_tcp("127.0.0.1", port)
            await huge.send(
                b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
            )
            status, _, _ = await read_head(huge)
            assert status == 431
            await huge.aclose()


async def test_the_egress_command_serves_and_a_stop_closes_its_tunnel(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        echo_target() as echo,
        egress_command(tmp_path, egress_config(cp, _profiles(echo.port), {"ops-bot": "web"})) as port,
    ):
        token = mint("run-c", generation=LATE)
        refused = await curl(
            "-x", f"http://127.0.0.1:{port}", "--proxy-user", f"run-c:{token}", "http://10.0.0.1/"
        )
        assert refused.status == 403 and refused.error["code"] == "egress_denied"
        stream, answer = await connect_via(port, f"127.0.0.1:{echo.port}", basic("run-c", token))
        assert answer.status == 200
        async with anyio.create_task_group() as tg:
            ended: list[float] = []

            async def flow() -> None:
                ended.append(await _stream_until_closed(stream))

            tg.start_soon(flow)
            await anyio.sleep(0.2)
            issued = time.monotonic()
            await issue(cp, "agent:ops-bot", "every run of the agent")
            await echo.until_closed(1, within=STOP_BOUND_S)
        assert ended and ended[0] - issued < STOP_BOUND_S
        await stream.aclose()
    log = (tmp_path / "egress.log").read_text()
    assert "tunnel of run run-c to 127.0.0.1:" in log and "cut by stop stp_" in log


def test_the_egress_command_exits_2_on_a_bad_config_and_3_without_a_control_plane(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[egress]\ndevelopment = true\nprofiles = { web = ["nope"] }\n')
    done = run_command("egress", "--config", str(bad))
    assert done.returncode == 2 and "profiles.web: 'nope'" in done.stderr and "control" in done.stderr
    config = egress_config(f"http://127.0.0.1:{free_port()}", {}, {})
    config["control"]["connect_timeout_s"] = 2.0
    unreachable = tmp_path / "unreachable.toml"
    unreachable.write_text(tomli_w.dumps(config))
    done = run_command("egress", "--config", str(unreachable), "--port", str(free_port()))
    assert done.returncode == 3, done.stderr
    assert "did not replay its stops" in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run_command("egress", "--config", str(unreachable), "--port", str(taken.getsockname()[1]))
    assert done.returncode == 1 and "cannot listen on 127.0.0.1:" in done.stderr, done.stderr


async def test_the_egress_command_refuses_a_control_token_not_sent_every_stop(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        config = egress_config(cp, {}, {})
        config["control"]["token"] = "tok-agent"  # an agent's token sees only its own stops
        path = tmp_path / "agent-token.toml"
        path.write_text(tomli_w.dumps(config))
        done = await anyio.to_thread.run_sync(lambda: run_command("egress", "--config", str(path)))
    assert done.returncode == 2, done.stderr
    assert "an egress proxy needs a token of role gateway" in done.stderr


async def test_a_request_cut_before_its_answer_is_told_why(tmp_path: Path) -> None:
    async with (
        control_plane(tmp_path / "control.db") as cp,
        echo_target("silent") as silent,
        echo_target("hang-up") as hangup,
        running_egress(egress_config(cp, _profiles(silent.port, hangup.port), {"ops-bot": "web"})) as (
            _,
            port,
        ),
    ):
        proxy = f"http://127.0.0.1:{port}"
        token = mint("run-q", generation=LATE)
        # A target that closes without answering: 503, not a bare close.
        gone = await curl("-x", proxy, "--proxy-user", f"run-q:{token}", f"http://127.0.0.1:{hangup.port}/")
        assert gone.status == 503 and gone.error["code"] == "upstream_unavailable"

        # A target that never answers, and a stop while the request waits: 403 stopped, at once.
        answers: list[Answer] = []
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                answers.append(
                    await curl(
                        "-x", proxy, "--proxy-user", f"run-q:{token}", f"http://127.0.0.1:{silent.port}/"
                    )
                )

            tg.start_soon(ask)
            await until(_received(silent))
            issued = time.monotonic()
            await issue(cp, "run:run-q", "hung")
        assert time.monotonic() - issued < STOP_BOUND_S + 0.5
        assert answers[0].status == 403 and answers[0].error["code"] == "stopped"
        await silent.until_closed(1, within=2)


def _received(echo: Echo) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return echo.received > 0

    return probe
