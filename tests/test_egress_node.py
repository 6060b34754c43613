"""A Node.js client through the egress proxy (issue 15's acceptance: curl, httpx and Node), with
Node's built-in ``http`` only (``tests/egress_node.js``): an absolute-URI request and a
``CONNECT`` tunnel to a loopback server, a refusal with its JSON body, 407 without credentials.

Skipped without ``node`` (fails under ``HALTWIRE_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from egress_harness import echo_target, egress_config, http_target, running_egress
from harness import service_missing
from leases_harness import mint
from stops_harness import control_plane

pytestmark = pytest.mark.anyio

CLIENT = Path(__file__).resolve().parent / "egress_node.js"


async def node(*args: str) -> dict[str, Any]:
    """The client's answer: ``{"status": N, "body": "..."}``."""
    path = shutil.which("node")
    assert path is not None  # the test skipped (or failed) before without it
    argv = [path, str(CLIENT), *args]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(argv, capture_output=True, text=True, timeout=20))
    assert done.stdout, (done.returncode, done.stderr)
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


async def test_a_node_client_is_served_refused_and_asked_for_credentials(tmp_path: Path) -> None:
    if shutil.which("node") is None:
        service_missing("node (Node.js)")
    async with (
        control_plane(tmp_path / "control.db") as cp,
        http_target() as web,
        echo_target() as other,
        running_egress(egress_config(cp, {"web": [f"127.0.0.1:{web}"]}, {"ops-bot": "web"})) as (_, port),
    ):
        creds = f"run-n:{mint('run-n', generation=10**6)}"
        target, denied = f"127.0.0.1:{web}", f"127.0.0.1:{other.port}"
        for mode in ("forward", "connect"):
            served = await node(mode, str(port), target, f"/node-{mode}", creds)
            assert served == {"status": 200, "body": f"hello from target /node-{mode}"}, mode
            refused = await node(mode, str(port), denied, "/", creds)
            assert refused["status"] == 403, (mode, refused)
            error = json.loads(refused["body"])["error"]
            assert error["code"] == "egress_denied" and denied in error["message"], mode
            anonymous = await node(mode, str(port), target, "/", "")
            assert anonymous["status"] == 407, (mode, anonymous)
            assert json.loads(anonymous["body"])["error"]["code"] == "proxy_auth_required", mode
        assert other.opened == 0
