"""tests/browser.py launches the real Chromium the dashboard and drill-report tests use."""

from __future__ import annotations

import pytest

from browser import chromium


@pytest.mark.anyio
async def test_chromium_renders_a_page() -> None:
    async with chromium() as browser:
        page = await browser.new_page()
        await page.set_content("<main><h1 id=t>haltwire</h1></main>")
        assert await page.inner_text("#t") == "haltwire"
