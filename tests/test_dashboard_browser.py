"""The operators' dashboard in real Chromium (issue 17): an operator signs in, stops an agent
after seeing the blast radius, sees the gateway refuse that agent's next tool call (a real MCP
client through a real gateway following the control plane), clears it and sees the call pass,
approves an intent; the live panels follow and say when they are stale; a viewer has no stop
button, and a write forged with the viewer's session is refused 403."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from playwright.async_api import Page, expect

from browser import chromium
from dashboard_harness import (
    TOKENS,
    active_stops,
    awaiting_approval,
    bearer,
    control_plane,
    intent_state,
    register,
)
from harness import TOKENS as AGENT_TOKENS
from harness import connect, running_gateway, running_upstream
from stops_harness import code_of, gateway_config, until

pytestmark = pytest.mark.anyio


async def _sign_in(page: Page, url: str, who: str) -> None:
    await page.goto(url)
    await page.fill("#token", TOKENS[who])
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#who")).to_contain_text({"operator": "oncall", "viewer": "watcher"}[who])
    await expect(page.locator("#live")).to_have_attribute("data-state", "live")


async def test_an_operator_stops_an_agent_the_gateway_refuses_it_then_clears_it_and_approves_an_intent(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path) as plane, running_upstream() as (_, upstream):
        await register(plane, "ops-bot", "run-1", ("lookup_order",))
        cancelled = await awaiting_approval(plane, "run-1", key="refund-1")  # the stop cancels it
        async with (
            running_gateway(gateway_config(upstream, plane.enforcement)) as (_, gateway),
            connect(gateway, AGENT_TOKENS["ops-bot"]) as ops,
            connect(gateway, AGENT_TOKENS["billing-bot"]) as billing,
            chromium() as browser,
        ):
            assert await code_of(ops) is None
            page = await browser.new_page()
            await _sign_in(page, plane.dashboard, "operator")

            # Stop: the form, then the blast radius, and nothing written before the confirmation.
            await page.select_option("#kind", "agent")
            await page.fill("#value", "ops-bot")
            await page.fill("#reason", "refund loop")
            await page.click("#review-stop")
            await expect(page.locator("#blast-runs")).to_have_text("1")
            await expect(page.locator("#blast-tenants")).to_have_text("acme")
            await expect(page.locator("#blast-agents")).to_have_text("ops-bot")
            await expect(page.locator("#blast-versions")).to_have_text("ops-bot@1.0")
            assert await active_stops(plane) == []
            await page.click("#confirm-stop")
            await expect(page.locator(".flash")).to_contain_text("Stopped agent:ops-bot")
            await expect(page.locator('#panel-stops tr[data-scope="agent:ops-bot"]')).to_be_visible()
            await expect(page.locator('#panel-runs tr[data-run="run-1"]')).to_contain_text("stopped by agent:ops-bot")

            async def ops_refused() -> bool:
                return await code_of(ops) == "stopped"

            await until(ops_refused)
            assert await code_of(billing) is None  # another agent goes on
            [stop] = await active_stops(plane)
            assert (stop["issued_by"], stop["reason"]) == ("oncall", "refund loop")

            # Clear it with a reason, from the stop's row.
            row = page.locator('#panel-stops tr[data-scope="agent:ops-bot"]')
            await row.locator("input[name=reason]").fill("loop fixed")
            await row.get_by_role("button", name="Clear").click()
            await expect(page.locator(".flash")).to_contain_text("Cleared agent:ops-bot")

            async def ops_served() -> bool:
                return await code_of(ops) is None

            await until(ops_served)

            # A stop issued elsewhere (the API) is pushed to the open page, without a reload.
            async with httpx2.AsyncClient(base_url=plane.admin) as api:
                r = await api.post("/v1/stops", json={"scope": "tenant:beta", "reason": "drill"}, headers=bearer("operator"))
                assert r.status_code == 201
            await expect(page.locator('#panel-stops tr[data-scope="tenant:beta"]')).to_be_visible()

            # Approve an intent awaiting approval: a new one, pushed to the open page.
            intent = await awaiting_approval(plane, "run-1", key="refund-2")
            await page.locator(f'#panel-intents tr[data-intent="{intent}"]').get_by_role("button", name="Approve").click()
            await expect(page.locator(".flash")).to_contain_text(f"Intent {intent} (refund) approved")
            assert await intent_state(plane, intent) == "pending"
            await expect(page.locator(f'#panel-intents tr[data-intent="{intent}"]')).to_have_count(0)

            # The run's page reports the stop that hit it.
            await page.click('#panel-runs a[href="/dashboard/runs/run-1"]')
            await expect(page.locator("#run-stops")).to_contain_text("agent:ops-bot")
            await expect(page.locator("#run-stops")).to_contain_text("loop fixed")
            await expect(page.locator(f'tr[data-intent="{cancelled}"]')).to_contain_text("cancelled")


async def test_a_viewer_has_no_stop_button_and_a_forged_stop_is_refused(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, chromium() as browser:
        await register(plane, "ops-bot", "run-1")
        await awaiting_approval(plane, "run-1")
        page = await browser.new_page()
        await _sign_in(page, plane.dashboard, "viewer")
        await expect(page.locator('#panel-runs tr[data-run="run-1"]')).to_be_visible()
        await expect(page.locator("#panel-intents tr[data-intent]")).to_have_count(1)
        await expect(page.locator("#review-stop")).to_have_count(0)
        await expect(page.locator("#stop-form")).to_have_count(0)
        await expect(page.get_by_role("button", name="Approve")).to_have_count(0)
        await expect(page.get_by_role("link", name="Stop run…")).to_have_count(0)

        # Forged: the viewer's own cookie and CSRF token, sent as the operator's form would be.
        csrf = await page.locator("input[name=csrf]").first.input_value()
        forged: dict[str, str | float | bool] = {"csrf": csrf, "scope": "agent:ops-bot", "reason": "forged", "key": "forged-1"}
        r = await page.request.post(f"{plane.admin}/dashboard/stops", form=forged, max_redirects=0)
        assert r.status == 403 and "role viewer may not stop.issue" in await r.text()
        assert await active_stops(plane) == []

        # The stream dropped (the admin listener down for a while): the page says it is stale,
        # and is live again once it has reconnected by itself.
        live = page.locator("#live")
        await plane.close_admin()
        await expect(live).to_have_attribute("data-state", "stale", timeout=3_000)
        await expect(live).to_contain_text("Stale")
        await plane.open_admin()
        await expect(live).to_have_attribute("data-state", "live", timeout=15_000)
