"""The processes of a stack start in any order: a gateway started before its control plane and
its upstream waits for them within ``connect_timeout_s``, and says which it waited for in vain."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from haltwire.demo.upstream import DemoUpstream
from haltwire.serve import serving
from harness import TOKENS, connect, running_gateway
from ports import free_ports
from stops_harness import control_plane, gateway_config

pytestmark = pytest.mark.anyio


async def test_a_gateway_started_first_waits_for_its_control_plane_and_upstream(tmp_path: Path) -> None:
    up_port, cp_port = free_ports(2)
    data = gateway_config(f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{cp_port}")
    data["control"]["connect_timeout_s"] = 30
    data["upstreams"][0]["connect_timeout_s"] = 30
    started, done = anyio.Event(), anyio.Event()
    served: list[bool] = []

    async def gateway() -> None:
        async with running_gateway(data) as (_, url):
            started.set()
            async with connect(url, TOKENS["ops-bot"]) as client:
                result = await client.call_tool("lookup_order", {"order_id": "A-1"})
                served.append(not result.is_error)
            await done.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(gateway)
        await anyio.sleep(1.5)
        assert not started.is_set(), "started without its upstream and its control plane"
        async with serving(DemoUpstream().http_app(), port=up_port):
            await anyio.sleep(1.0)
            assert not started.is_set(), "started without its control plane's stops"
            async with control_plane(tmp_path / "control.db", port=cp_port):
                with anyio.fail_after(15):
                    await started.wait()
                with anyio.fail_after(15):
                    while not served:
                        await anyio.sleep(0.05)
                done.set()
    assert served == [True]


@pytest.mark.parametrize("missing", ["control", "upstream"])
async def test_what_never_comes_up_is_named_once_connect_timeout_s_has_run_out(
    tmp_path: Path, missing: str
) -> None:
    from haltwire.gateway import ControlUnreachable, UpstreamError

    up_port, cp_port = free_ports(2)
    data = gateway_config(f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{cp_port}")
    data["control"]["connect_timeout_s"] = 1.5
    data["upstreams"][0]["connect_timeout_s"] = 1.5
    raised: type[Exception] = ControlUnreachable
    said = f"control plane http://127.0.0.1:{cp_port} did not replay its stops within 1.5 s: not listening (ConnectError"
    async with serving(DemoUpstream().http_app(), port=up_port) if missing == "control" else control_plane(
        tmp_path / "control.db", port=cp_port
    ):
        if missing == "upstream":
            raised = UpstreamError
            said = f"upstream 'demo' (http://127.0.0.1:{up_port}/mcp) did not start within 1.5 s: not listening (ConnectError"
        t0 = anyio.current_time()
        with pytest.raises(raised) as caught:
            async with running_gateway(data):
                pass
        waited = anyio.current_time() - t0
    assert str(caught.value).startswith(said), str(caught.value)
    assert 1.4 < waited < 10, "it waited for what was missing, up to connect_timeout_s"
