"""A watch client that hangs up in the middle of a long replay costs the control plane nothing
more: the replay stops at the next write, no ``socket.send() raised exception.`` floods the log
(asyncio logs it for each write to a connection already lost), and on PostgreSQL no page read
is cut mid-query (psycopg closes the shared read connection when it is: ``query cancellation
interrupted``). Issue 12, point 7.

The clients are another process, as real ones are: a hang-up must be able to arrive while the
control plane is writing, which a client on the control plane's own event loop never does.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest

from control_harness import raw_sql
from plane_harness import TOKENS, full_plane

pytestmark = pytest.mark.anyio

CHANGES: Final = 3000
ROUNDS: Final = 20

#: A client that asks for the whole history, reads a little of it, and closes the socket with
#: the rest unread (the kernel answers the control plane's next write with a reset).
RUDE: Final = """
import socket, sys, time
host, port, token, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
for i in range(rounds):
    s = socket.create_connection((host, port))
    s.sendall(f"GET /v1/watch?since=0 HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {token}\\r\\n\\r\\n".encode())
    got, want = 0, 4000 * (i % 7 + 1)
    while got < want:
        data = s.recv(65536)
        if not data:
            break
        got += len(data)
    s.close()
    time.sleep(0.1)
"""


@pytest.fixture
def logged() -> Iterator[list[str]]:
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)


def seed(registry: dict[str, Any], changes: int) -> None:
    """``changes`` stops written straight into the registry's table, in one statement."""
    reason = "runaway " + "x" * 500
    raw_sql(registry)(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < "
        f"{changes}) INSERT INTO changes (revision, kind, stop_id, scope, reason, actor, at, expires_at) "
        f"SELECT n, 'stop', 'stp_' || n, 'run:r-' || n, '{reason}', 'op', {time.time()}, NULL FROM g"
    )


async def full_replay(client: httpx2.AsyncClient) -> int:
    """How many changes a well-behaved watcher is sent before ``caught-up``."""
    seen = 0
    headers = {"Authorization": f"Bearer {TOKENS['viewer']}"}
    with anyio.fail_after(60):
        async with client.stream("GET", "/v1/watch?since=0", headers=headers) as response:
            async for line in response.aiter_lines():
                if line.startswith("event: stop"):
                    seen += 1
                elif line.startswith(": caught-up"):
                    return seen
    raise AssertionError("the stream ended before caught-up")


async def test_watch_clients_hanging_up_mid_replay_leave_no_trace(
    store: dict[str, Any], logged: list[str]
) -> None:
    async with full_plane(store, heartbeat_s=1.0) as (client, _):
        seed(store, CHANGES)
        where = urlsplit(str(client.base_url))
        assert where.hostname is not None and where.port is not None
        argv = [sys.executable, "-c", RUDE, where.hostname, str(where.port), TOKENS["viewer"], str(ROUNDS)]
        done = await anyio.run_process(argv, check=False, stderr=subprocess.STDOUT)
        assert done.returncode == 0, done.stdout.decode()
        await anyio.sleep(1.0)  # what a replay still writes after its client has gone
        assert await full_replay(client) == CHANGES
    sends = [m for m in logged if "socket.send() raised" in m]
    cut = [m for m in logged if "query cancellation" in m]
    assert (len(sends), len(cut)) == (0, 0), (sends[:3], cut[:3], len(sends), len(cut))
