"""Running ``haltwire drill`` as a command, for the drill's tests."""

from __future__ import annotations

import subprocess
import sys

import pytest


def drill(*args: str, timeout: float = 90, embedded: bool = True) -> subprocess.CompletedProcess[str]:
    """``haltwire drill [--embedded] ARGS`` to its exit; past ``timeout``, SIGTERM (the drill
    takes its stack down on it) and the test fails."""
    command = [sys.executable, "-m", "haltwire", "drill", *(["--embedded"] if embedded else []), *args]
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.terminate()
            out, err = child.communicate(timeout=30)
            pytest.fail(f"the drill ran past {timeout:g} s; its stderr:\n{err}")
    return subprocess.CompletedProcess(command, child.returncode, out, err)
