"""Who calls: identities from the gateway's token table, several versions (and tenants) of one agent
id, ceilings per identity, and the config errors that keep a token naming one identity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from cli_process import run_haltwire
from control_harness import TOKEN, control, issue
from haltwire.config import ConfigError
from haltwire.gateway.config import load_config
from haltwire.identity import token_sha256
from haltwire.meta import KEY_META, REPLAYED_META
from harness import config_dict, connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio

TWO_VERSIONS = """
[gateway]
development = true

[[identities]]
agent = "ops-bot"
tenant = "acme"
version = "1.4"
token = "tok-stable"

[[identities]]
agent = "ops-bot"
tenant = "acme"
version = "1.5"
token = "tok-canary"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:9/mcp"
"""


def test_two_identities_with_one_token_are_a_config_error_and_exit_2(tmp_path: Path) -> None:
    # The second entry names the first one's token by its hash: before, the second silently won
    # and every call with that token counted as billing-bot.
    path = tmp_path / "gw.toml"
    path.write_text(
        TWO_VERSIONS.replace(
            'token = "tok-canary"', f'token_sha256 = "{token_sha256("tok-stable")}"'
        ).replace('agent = "ops-bot"\ntenant = "acme"\nversion = "1.5"', 'agent = "billing-bot"')
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: identities: "), message
    assert "[0] and [1] have the same token" in message
    done = run_haltwire("gateway", "--config", str(path), timeout=30)
    assert done.returncode == 2 and f"{path}: identities: " in done.stderr
    assert "Traceback" not in done.stderr


def test_versions_of_one_agent_are_identities_of_their_own(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(TWO_VERSIONS)
    table = load_config(path).token_table()
    stable, canary = table.resolve("tok-stable"), table.resolve("tok-canary")
    assert stable is not None and (stable.agent, stable.version) == ("ops-bot", "1.4")
    assert canary is not None and (canary.agent, canary.version) == ("ops-bot", "1.5")


def test_one_agent_version_and_tenant_twice_is_a_config_error(tmp_path: Path) -> None:
    # Two entries for one identity would leave its limits and lease policy ambiguous.
    path = tmp_path / "gw.toml"
    path.write_text(TWO_VERSIONS.replace('version = "1.5"', 'version = "1.4"'))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: identities: "), message
    assert "[0] and [1] are both agent ops-bot version 1.4 of tenant acme" in message


# -- through a gateway: real control plane, real MCP clients ---------------------------------

STABLE = {"agent": "ops-bot", "tenant": "acme", "version": "1.4", "token": "tok-stable"}
CANARY = {"agent": "ops-bot", "tenant": "acme", "version": "1.5", "token": "tok-canary"}
#: The same agent id, serving another tenant.
GLOBEX = {"agent": "ops-bot", "tenant": "globex", "version": "1.4", "token": "tok-globex"}


def refusal_of(result: CallToolResult) -> dict[str, Any] | None:
    """The refusal's ``error`` object, or None when the call was served."""
    if not result.is_error:
        return None
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return error


async def lookup(client: Client, order: str = "A-1", key: str | None = None) -> CallToolResult:
    meta = {KEY_META: key} if key is not None else None
    return await client.call_tool("lookup_order", {"order_id": order}, meta=meta)  # type: ignore[arg-type]


async def code_of(client: Client) -> str | None:
    error = refusal_of(await lookup(client))
    return None if error is None else str(error["code"])


async def until_code(client: Client, code: str | None, within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while await code_of(client) != code:
            await anyio.sleep(0.05)


async def test_a_version_stop_refuses_the_canary_and_leaves_the_stable_version_served(
    tmp_path: Path,
) -> None:
    async with (
        control(tmp_path) as (plane, _),
        running_upstream() as (demo, up),
    ):
        link = {"url": str(plane.base_url), "token": TOKEN["gateway"]}
        config = config_dict(up, identities=[STABLE, CANARY, GLOBEX], control=link)
        async with (
            running_gateway(config) as (_, url),
            connect(url, "tok-stable") as stable,
            connect(url, "tok-canary") as canary,
            connect(url, "tok-globex") as globex,
        ):
            for client in (stable, canary, globex):
                assert await code_of(client) is None

            stop = await issue(plane, "version:ops-bot@1.5")
            await until_code(canary, "stopped")
            served = demo.served["lookup_order"]
            error = refusal_of(await lookup(canary))
            assert error is not None and (error["scope"], error["stop_id"]) == (
                "version:ops-bot@1.5",
                stop["stop_id"],
            )
            assert demo.served["lookup_order"] == served, "the stopped canary reached no upstream"
            assert await code_of(stable) is None and await code_of(globex) is None
            assert demo.served["lookup_order"] == served + 2

            # A tenant stop takes one tenant's ops-bot and leaves the other's; an agent stop all.
            await issue(plane, "tenant:globex")
            await until_code(globex, "stopped")
            assert await code_of(stable) is None
            await issue(plane, "agent:ops-bot")
            await until_code(stable, "stopped")


async def test_each_version_and_tenant_counts_against_its_own_budget() -> None:
    canary = {**CANARY, "limits": {"budget": 1}}
    async with (
        running_upstream() as (_, up),
        running_gateway(config_dict(up, identities=[STABLE, canary, GLOBEX], limits={"budget": 3})) as (
            _,
            url,
        ),
        connect(url, "tok-stable") as stable_client,
        connect(url, "tok-canary") as canary_client,
        connect(url, "tok-globex") as globex_client,
    ):
        # The canary's own limit (1), its own count: spending it leaves the stable version's.
        assert await code_of(canary_client) is None
        assert await code_of(canary_client) == "budget_exhausted"
        for _ in range(3):
            assert await code_of(stable_client) is None
        error = refusal_of(await lookup(stable_client))
        assert error is not None and error["code"] == "budget_exhausted"
        assert "all 3 tool calls" in error["message"]
        # The same agent id and version in another tenant: a count of its own.
        for _ in range(3):
            assert await code_of(globex_client) is None
        assert await code_of(globex_client) == "budget_exhausted"


async def test_one_agent_id_in_two_tenants_shares_no_idempotency_record() -> None:
    async with running_upstream() as (demo, up):
        config = config_dict(up, identities=[STABLE, CANARY, GLOBEX])
        config["upstreams"][0]["labels"] = {"lookup_order": "bounded"}
        async with (
            running_gateway(config) as (_, url),
            connect(url, "tok-stable") as stable,
            connect(url, "tok-canary") as canary,
            connect(url, "tok-globex") as globex,
        ):
            first = await lookup(stable, "A-1", key="refund-42")
            assert not first.is_error and REPLAYED_META not in (first.meta or {})
            # Another version of the same agent in the same tenant: the same operation, answered
            # from the record (a repeat after a switch of version is not made twice).
            again = await lookup(canary, "A-1", key="refund-42")
            assert (again.meta or {}).get(REPLAYED_META) is True
            # Another tenant's ops-bot with the same key: its own call, not acme's answer.
            other = await lookup(globex, "A-1", key="refund-42")
            assert not other.is_error and REPLAYED_META not in (other.meta or {})
            # Keys the gateway derives differ by tenant too (the upstream sees every tenant's).
            derived = [(await lookup(c, "B-2")).meta or {} for c in (stable, globex)]
            assert derived[0][KEY_META] != derived[1][KEY_META]
        assert demo.served["lookup_order"] == 4


async def test_a_lease_opt_out_of_one_version_is_not_another_versions() -> None:
    leases = {"keys": [{"kid": "k1", "secret": "k1-secret-" + "x" * 32}]}
    async with (
        running_upstream() as (_, up),
        running_gateway(
            config_dict(up, identities=[STABLE, {**CANARY, "lease": "optional"}], leases=leases)
        ) as (_, url),
        connect(url, "tok-stable") as stable,
        connect(url, "tok-canary") as canary,
    ):
        assert await code_of(stable) == "lease_invalid"
        assert await code_of(canary) is None
