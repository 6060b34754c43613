from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from gateway_processes import Processes
from harness import postgres_section


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A control plane's ``[registry]`` section on each backend: suites that take it run on both."""
    if request.param == "sqlite":
        yield {"backend": "sqlite", "path": str(tmp_path / "control.db")}
        return
    with postgres_section() as section:
        yield section


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The test's subprocesses (``gateway_processes``), every one killed at its end."""
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()
