"""Real Chromium for tests, driven by Playwright through the executable's path.

No browser download works here: the tests launch Debian's ``chromium`` (``.ci/run`` installs it
when absent). Without it, or without the ``playwright`` package, a test skips; under
``HALTWIRE_REQUIRE_SERVICES=1`` (CI) it fails instead, like PostgreSQL and Redis.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from harness import service_missing

if TYPE_CHECKING:
    from playwright.async_api import Browser

#: Where Debian and other distributions put Chromium; HALTWIRE_CHROMIUM overrides.
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str:
    """Chromium's executable, or skip (fail under CI) when there is none."""
    explicit = os.environ.get("HALTWIRE_CHROMIUM")
    if explicit:
        return explicit
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    service_missing("Chromium (apt-get install chromium)")
    raise AssertionError("unreachable")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium for one test, closed at its end."""
    path = chromium_path()
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        service_missing("the playwright package")
        raise
    async with async_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()
