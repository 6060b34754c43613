"""Making the proxy the only way out (issue 15): an agent process in a network namespace whose
only reachable address is the egress proxy's (``netns_harness``: a veth pair, no default route,
no resolver), the recipe of ``docs/egress.md``. Through the proxy it reaches the allowed target;
after a stop the tunnel it holds open is closed at once, and it reaches the target by no path:
not through the proxy (403), not directly by the target's address nor a public one, not on
another port of the proxy's address, not by name (no resolver).

Needs root and iproute2: skipped without them, failed under ``HALTWIRE_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from egress_harness import Answer, basic, egress_config, parse_answer
from haltwire.egress import EgressProxy, parse_config
from haltwire.runtime.egress import proxy_env
from haltwire.serve import bind, serving
from leases_harness import mint
from netns_harness import TUNNEL, Namespace, isolated_namespace, probe, run_inside
from stops_harness import control_plane, issue, until

pytestmark = pytest.mark.anyio


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"hello from {request.url.path}")


async def _curl_inside(ns: Namespace, env: dict[str, str], url: str) -> Answer:
    done = await anyio.to_thread.run_sync(
        lambda: run_inside(ns, ["curl", "-s", "-i", "--max-time", "5", url], env)
    )
    return parse_answer(done.stdout, (done.returncode, done.stderr))


async def test_inside_the_namespace_the_proxy_is_the_only_way_out_and_a_stop_closes_it(tmp_path: Path) -> None:
    with isolated_namespace() as ns:
        app = Starlette(routes=[Route("/{path:path}", _hello)])
        async with (
            control_plane(tmp_path / "control.db") as cp,
            serving(app, host=ns.target_ip, lifespan="off") as target_url,
            anyio.create_task_group() as tg,
        ):
            web = int(target_url.rsplit(":", 1)[1])
            config = egress_config(cp, {"web": [f"{ns.target_ip}:{web}"]}, {"ops-bot": "web"})
            proxy = EgressProxy(parse_config(config))
            port = await tg.start(proxy.run, bind(ns.host_ip, 0))
            token = mint("run-ns", generation=10**6)
            env = proxy_env(f"http://{ns.host_ip}:{port}", "run-ns", token)
            url = f"http://{ns.target_ip}:{web}/inside"

            served = await _curl_inside(ns, env, url)
            assert (served.status, served.body) == (200, b"hello from /inside")
            # The ways around the proxy are closed even before a stop.
            paths = {
                "direct": (ns.target_ip, web),
                "proxy address, target port": (ns.host_ip, web),
                "a public address": ("203.0.113.80", 443),
            }
            before = await anyio.to_thread.run_sync(lambda: probe(ns, paths, "example.com"))
            assert "unreachable" in before["direct"] and "unreachable" in before["a public address"], before
            assert "ConnectionRefused" in before["proxy address, target port"], before
            assert before["dns"] != "resolved", before

            # A tunnel the process inside holds open through the proxy, served once.
            argv = ns.argv(sys.executable, "-c", TUNNEL, ns.host_ip, str(port), f"{ns.target_ip}:{web}")
            tunnel = await anyio.open_process(
                [*argv, basic("run-ns", token)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            assert tunnel.stdout is not None
            lines = BufferedByteReceiveStream(tunnel.stdout)
            async with tunnel:
                try:
                    with anyio.fail_after(10):
                        assert await lines.receive_until(b"\n", 100) == b"served"
                    issued = time.monotonic()
                    await issue(cp, "run:run-ns", "exfiltration")
                    with anyio.fail_after(5):  # the target's keep-alive would close it only after 5 s
                        assert await lines.receive_until(b"\n", 100) == b"closed"
                    assert time.monotonic() - issued < 1.0
                finally:
                    if tunnel.returncode is None:
                        tunnel.kill()  # a failure above leaves no process behind

            async def refused() -> bool:
                answer = await _curl_inside(ns, env, url)
                return answer.status == 403 and answer.error["code"] == "stopped"

            await until(refused)
            paths["proxy"] = (ns.host_ip, port)
            after = await anyio.to_thread.run_sync(lambda: probe(ns, paths, "example.com"))
            assert after["proxy"] == "connected", after  # the proxy answers, and refuses (above)
            assert "unreachable" in after["direct"] and "unreachable" in after["a public address"], after
            assert "ConnectionRefused" in after["proxy address, target port"], after
            assert after["dns"] != "resolved", after
            direct = await anyio.to_thread.run_sync(
                lambda: run_inside(ns, ["curl", "-s", "--max-time", "3", "--noproxy", "*", url], {})
            )
            assert direct.returncode != 0 and direct.stdout == b""
            tg.cancel_scope.cancel()
