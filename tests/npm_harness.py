"""npm packages the tests run (the MCP conformance suite, the TypeScript SDK), installed on first use.

Each goes into a folder of its own under ``.venv/`` (or ``~/.cache/haltwire`` without one); npm's
own cache in ``~/.npm`` makes a reinstall quick. Without npm and Node.js a test skips, or fails
under ``HALTWIRE_REQUIRE_SERVICES=1`` (CI), like PostgreSQL and Redis.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from harness import service_missing

REPO: Final = Path(__file__).resolve().parents[1]


def install_dir(name: str) -> Path:
    venv = REPO / ".venv"
    return venv / name if venv.is_dir() else Path.home() / ".cache" / "haltwire" / name


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One installer at a time (pytest runs in several worktrees may share the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def installed_version(directory: Path, package: str) -> str | None:
    manifest = directory / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return str(version)


def node_and_npm() -> tuple[str, str]:
    """``node`` and ``npm`` from PATH, or skip (fail under CI)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        service_missing("npm and Node.js")
        raise AssertionError("unreachable")
    return node, npm


def npm_install(directory: Path, specs: list[str]) -> None:
    """``npm install`` ``specs`` (``name@version``) into ``directory``; skip (fail under CI) on failure.
    The caller holds ``locked(directory)``."""
    _, npm = node_and_npm()
    done = subprocess.run(
        [npm, "install", "--prefix", str(directory), "--no-audit", "--no-fund", "--loglevel=error", *specs],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        service_missing(f"the npm packages {', '.join(specs)} ({done.stderr.strip()[-500:]})")
