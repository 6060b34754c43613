"""``haltwire up`` from a fresh directory, as a user runs it: a real process tree on loopback.

The first run makes the secrets (files 0600 in a 0700 folder, printed once), starts every part and
prints its URLs and commands: each URL answers, the official MCP client calls a tool through the
gateway with the agent token from its file, the printed ``haltwire call`` and ``haltwire stop``
work as printed (run by bash), and the stopped agent's next call is refused ``stopped``. SIGTERM
exits 0 and leaves none of its processes (the control plane's agents' child among them). A
second run in the same folder prints no secret, names the folder that holds them, and still
refuses the agent (its stop is in the database). A taken port and a part that cannot start are
one sentence each, exit 2 and 1, without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from cli_process import run_haltwire
from haltwire.demo.client import connect
from haltwire.up.state import SECRETS, Ports

pytestmark = pytest.mark.anyio

READY = "Ctrl-C stops every process."
#: Starting five processes on a busy 2-core machine can take most of a minute.
START_S = 120.0


def free_base() -> int:
    """A ``--port-base`` whose five ports are free now, below the ephemeral range (32768 up), where
    other tests' servers and connections take theirs."""
    for _ in range(200):
        base = random.randrange(10000, 32000)
        if Ports.from_base(base).taken() is None:
            return base
    raise AssertionError("no free port base")


class Up:
    """``haltwire up`` running in ``cwd``, its stdout and stderr in files."""

    def __init__(self, cwd: Path, base: int, name: str) -> None:
        self.out, self.err = cwd / f"{name}.stdout", cwd / f"{name}.stderr"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "haltwire", "up", "--port-base", str(base)],
                cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )  # fmt: skip

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def ready(self) -> str:
        deadline = time.monotonic() + START_S
        while READY not in self.out.read_text():
            assert self.proc.poll() is None, f"haltwire up exited {self.proc.returncode}:\n{self.text()}"
            assert time.monotonic() < deadline, f"haltwire up not ready in {START_S} s:\n{self.text()}"
            time.sleep(0.1)
        return self.out.read_text()

    def descendants(self) -> set[int]:
        """Every process under it (children, and theirs), from /proc."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                parents[int(entry.name)] = int(fields[1])
        found: set[int] = set()
        frontier = {self.proc.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
            found |= frontier
        return found

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            for pid in self.descendants():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()


def printed(text: str, start: str) -> str:
    """The printed command line beginning with ``haltwire START`` (by whatever path)."""
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and Path(words[0]).name == "haltwire" and words[1] == start:
            return line.strip()
        if len(words) > 3 and words[1:3] == ["-m", "haltwire"] and words[3] == start:
            return line.strip()
    raise AssertionError(f"no 'haltwire {start}' command printed:\n{text}")


def bash(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=60)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def refused_code(mcp_url: str, token: str) -> str | None:
    async with connect(mcp_url, token) as client:
        result = await client.call_tool("lookup_order", {"order_id": "A-1"})
    if not result.is_error:
        assert "A-1" in str(result.structured_content)
        return None
    code: str = (result.structured_content or {})["error"]["code"]
    return code


async def test_up_serves_every_part_and_goes_down_on_sigterm(tmp_path: Path) -> None:
    base = free_base()
    up = Up(tmp_path, base, "first")
    try:
        out = up.ready()
        state = tmp_path / ".haltwire"
        folder = state / "secrets"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in SECRETS:
            path = folder / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
            assert path.read_text().strip() in out, f"{name} made now, so printed once"

        assert f"Secrets: made now and shown above, once; in {folder}/" in out
        progress = up.err.read_text()
        for part in ("operators' listener", "enforcement listener", "agents' listener", "gateway", "executor"):
            assert re.search(rf"^haltwire up: the (control plane's )?{part} is ready \(", progress, re.M), progress
        urls = dict(re.findall(r"^  (gateway \(MCP\)|control plane, agents|control plane, admin|dashboard|demo upstream)\s+(\S+)", out, re.M))
        assert len(urls) == 5, out
        mcp_url, admin = urls["gateway (MCP)"], urls["control plane, admin"]
        async with httpx2.AsyncClient(timeout=10) as http:
            for probe in (
                mcp_url.removesuffix("/mcp") + "/readyz",
                urls["control plane, agents"] + "/healthz",
                admin + "/healthz",
                admin + "/docs",
                urls["demo upstream"].removesuffix("/mcp") + "/state",
            ):
                assert (await http.get(probe)).status_code == 200, probe
            # The dashboard, on the admin listener: the operator's token from its file signs in.
            page = await http.get(urls["dashboard"])
            assert page.status_code in (200, 401) and 'name="token"' in page.text
            signed_in = await http.post(
                urls["dashboard"] + "sign-in",
                data={"token": (folder / "operator.token").read_text().strip()},
                headers={"origin": admin},
                follow_redirects=True,
            )
            assert signed_in.status_code == 200 and "haltwire_session" in http.cookies, signed_in.text[:300]

        token = (folder / "agent.token").read_text().strip()
        assert await refused_code(mcp_url, token) is None  # served

        called = bash(printed(out, "call"), tmp_path)
        assert called.returncode == 0 and "A-1" in called.stdout, called
        for args, said in (
            (("lookup_order", "--token", "not-a-token"), "refused the session"),
            (("no_such_tool", "--token", token), "answered the call with an error"),
        ):
            result = run_haltwire("call", mcp_url, *args, cwd=tmp_path)
            assert result.returncode == 1 and said in result.stderr and "Traceback" not in result.stderr, result
        stopped = bash(printed(out, "stop"), tmp_path)
        assert stopped.returncode == 0 and stopped.stdout.startswith("stp_"), stopped
        deadline = time.monotonic() + 10
        while (code := await refused_code(mcp_url, token)) is None and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert code == "stopped"
        listed = bash(printed(out, "stops"), tmp_path)
        assert listed.returncode == 0 and "agent:demo-agent" in listed.stdout, listed

        tree = up.descendants()
        assert len(tree) >= 5, tree  # upstream, control plane and its agents' child, gateway, executor
        assert up.terminate() == 0, up.text()
        assert not [pid for pid in tree if alive(pid)], "a process outlived haltwire up"
        assert "Traceback" not in up.text()
    finally:
        up.kill()

    # Again in the same folder: no secret printed, the folder named; SIGTERM while it starts.
    again = Up(tmp_path, base, "second")
    try:
        deadline = time.monotonic() + START_S
        while "starting the control plane" not in again.err.read_text():
            assert again.proc.poll() is None and time.monotonic() < deadline, again.text()
            await anyio.sleep(0.05)
        text = again.text()
        for name in SECRETS:
            assert (folder / name).read_text().strip() not in text, f"{name} printed again"
        assert f"Secrets: the first run's, in {folder}/ (not shown again)" in text
        assert again.terminate() == 0, again.text()
        assert Ports.from_base(base).taken() is None, "a process it had started outlived it"
    finally:
        again.kill()


def test_a_taken_port_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    base = free_base()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 100))  # the gateway's
        holder.listen()
        result = run_haltwire("up", "--port-base", str(base), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {base + 100} (the gateway)" in lines[0] and "--port-base" in lines[0], result.stderr
    assert not (tmp_path / ".haltwire" / "secrets" / "operator.token").exists()  # nothing made


def test_a_part_that_does_not_start_is_named_and_the_rest_stopped(tmp_path: Path) -> None:
    (tmp_path / ".haltwire" / "control.db").mkdir(parents=True)  # no database can be opened there
    base = free_base()
    up = Up(tmp_path, base, "broken")
    try:
        assert up.proc.wait(START_S) == 1
        last = up.err.read_text().strip().splitlines()[-1]
        assert last.startswith("haltwire up: the control plane exited with status"), up.text()
        assert "control.db" in last and "Traceback" not in up.text()
        assert Ports.from_base(base).taken() is None  # the upstream it had started is gone
    finally:
        up.kill()


def test_dev_up_runs_haltwire_up_and_the_ports_move_as_the_readme_says() -> None:
    root = Path(__file__).parent.parent
    result = subprocess.run([str(root / "dev"), "up", "--help"], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--port-base" in result.stdout, result
    assert Ports.from_base(8700) == Ports(8700, 8701, 8702, 8800, 8900)  # the defaults
    assert Ports.from_base(9700) == Ports(9700, 9701, 9702, 9800, 9900)


def test_bad_input_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    secrets = tmp_path / ".haltwire" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "operator.token").write_text("short\n")  # not a secret up made
    result = run_haltwire("up", "--port-base", str(free_base()), cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result
    assert "operator.token holds no usable secret" in result.stderr and result.stdout == ""
    assert not (secrets / "agent.token").exists()  # nothing started, nothing made past the bad one

    for args, said in (
        (("call", "http://127.0.0.1:1/mcp", "lookup_order", "[1]", "--token", "t"), "must be a JSON object"),
        (("call", "127.0.0.1:1/mcp", "lookup_order", "--token", "t"), "is not a URL"),
        (("up", "--port-base", "65500"), "outside 1-65535"),
    ):
        result = run_haltwire(*args, cwd=tmp_path)
        assert result.returncode == 2 and said in result.stderr and result.stderr.count("\n") == 1, result
    result = run_haltwire("call", "http://127.0.0.1:1/mcp", "lookup_order", "--token", "t", cwd=tmp_path)
    assert result.returncode == 3 and "cannot reach http://127.0.0.1:1/mcp" in result.stderr, result
