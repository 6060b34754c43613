"""Enforcement points check their token's role at start-up (issue 12, point 6).

A gateway whose ``[control]`` token had the agent role started without a word and then saw only
the stops an agent may see: a ``tool:`` stop and another agent's stop went unenforced through it.
The control plane says who a token is and whether it is sent every stop (``GET /v1/whoami``);
the gateway and the executor ask before they serve and refuse to, exit 2 and one sentence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
import tomli_w

from cli_process import run_haltwire_async
from control_harness import ROLES, TOKEN, auth
from control_harness import config_dict as control_dict
from haltwire.control import create_app, parse_control_config
from haltwire.control.access import ROLES as ACTIONS
from haltwire.control.access import reads_every_stop
from haltwire.control.routes.admin import EnforcementOnly
from haltwire.serve import serving
from harness import TOKENS, connect, running_gateway, running_upstream
from stops_harness import code_of, control_plane, gateway_config, issue, until

pytestmark = pytest.mark.anyio

#: The roles sent every stop: the others may not watch (tripwire) or see only their own (agent).
EVERY_STOP = {"operator", "gateway", "executor", "viewer"}


def agent_sentence(url: str, point: str, role: str) -> str:
    return (
        f"the control plane at {url} knows this token as agent-1, of role agent, which is not sent "
        f"every stop: {point} needs a token of role {role}"
    )


def test_which_roles_read_every_stop_follows_the_role_table() -> None:
    assert {r for r in ROLES if reads_every_stop(r)} == EVERY_STOP
    assert ACTIONS["watch"] >= EVERY_STOP and ACTIONS["whoami"] == set(ROLES)


async def test_whoami_names_every_role_and_whether_it_is_sent_every_stop(tmp_path: Path) -> None:
    from openapi_harness import conforms

    async with control_plane(tmp_path / "control.db") as cp, httpx2.AsyncClient(base_url=cp) as http:
        for role in ROLES:
            r = await http.get("/v1/whoami", headers=auth(role))
            body = conforms(r, "get", "/v1/whoami")
            assert r.status_code == 200 and body["reads_every_stop"] is (role in EVERY_STOP), body
            agent = role == "agent"
            assert body == {
                "name": f"{role}-1",
                "role": role,
                "agent": "a1" if agent else None,
                "tenant": "default" if agent else None,
                "version": "0" if agent else None,
                "reads_every_stop": role in EVERY_STOP,
                "drill": False,  # no drill identity here (test_drill_running.py has them)
            }
        r = await http.get("/v1/whoami")
        assert r.status_code == 401 and conforms(r, "get", "/v1/whoami")["error"]["code"] == "unauthenticated"


async def test_a_gateway_with_an_agent_token_refuses_to_start_and_with_its_own_enforces_every_stop(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path / "control.db") as cp, running_upstream() as (_, up):
        # Neither is a stop agent a1 may see: through an agent's token, neither was enforced.
        await issue(cp, "tool:lookup_order")
        await issue(cp, "agent:billing-bot")
        wrong = gateway_config(up, cp)
        wrong["control"]["token"] = TOKEN["agent"]
        with pytest.raises(Exception, match="which is not sent every stop") as raised:
            async with running_gateway(wrong):
                pass
        assert str(raised.value) == agent_sentence(cp, "a gateway", "gateway")
        assert type(raised.value).__name__ == "WrongRole"

        async with (
            running_gateway(gateway_config(up, cp)) as (_, url),
            connect(url, TOKENS["ops-bot"]) as ops,
        ):
            assert await code_of(ops) == "stopped"


async def test_the_gateway_command_exits_2_with_one_sentence(tmp_path: Path) -> None:
    async with control_plane(tmp_path / "control.db") as cp:
        config = gateway_config("http://127.0.0.1:9", cp)
        config["control"]["token"] = TOKEN["agent"]
        config["upstreams"][0]["connect_timeout_s"] = 1
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(config))
        done = await run_haltwire_async("gateway", "--config", str(path), "--port", "0")
    err = done.stderr
    assert done.returncode == 2, err
    assert err.strip().splitlines() == [f"haltwire gateway: {agent_sentence(cp, 'a gateway', 'gateway')}"]


async def test_a_token_the_enforcement_listener_refuses_is_said_so(tmp_path: Path) -> None:
    """The enforcement listener refuses an agent's token 403: the gateway does not start either,
    and says what it needs instead of "use the control plane's port"."""
    data = control_dict({"backend": "sqlite", "path": str(tmp_path / "control.db")}, 0.2)
    async with (
        serving(EnforcementOnly(create_app(parse_control_config(data))), graceful_s=1) as cp,
        running_upstream() as (_, up),
    ):
        wrong = gateway_config(up, cp)
        wrong["control"]["token"] = TOKEN["agent"]
        with pytest.raises(Exception, match="refused this token") as raised:
            async with running_gateway(wrong):
                pass
        said = str(raised.value)
        assert said.startswith(f"the control plane at {cp} refused this token (403 forbidden: role agent")
        assert said.endswith(": a gateway needs a token of role gateway"), said
        async with running_gateway(gateway_config(up, cp)):
            pass


async def test_an_unreachable_control_plane_at_start_up_is_what_it_was(tmp_path: Path) -> None:
    """Not a role problem: the gateway still says the control plane did not replay its stops."""
    from haltwire.gateway import ControlUnreachable

    async with running_upstream() as (_, up):
        config = gateway_config(up, "http://127.0.0.1:9")
        config["control"]["connect_timeout_s"] = 1  # waited for until then (it may start later)
        with pytest.raises(ControlUnreachable, match=r"did not replay its stops within 1 s: not listening \(ConnectError"):
            async with running_gateway(config):
                pass


async def test_the_executor_with_an_agent_token_exits_2_with_one_sentence(tmp_path: Path) -> None:
    from executor_harness import control_plane as executor_plane
    from executor_harness import gateway_config as executor_config
    from executor_harness import shop

    async with executor_plane(tmp_path / "control.db") as cp, shop(tmp_path) as (_, up):
        config: dict[str, Any] = executor_config(up, cp)
        config["executor"]["token"] = TOKEN["agent"]
        path = tmp_path / "gateway.toml"
        path.write_text(tomli_w.dumps(config))
        done = await run_haltwire_async("executor", "--config", str(path))
    err = done.stderr
    assert done.returncode == 2, err
    assert err.strip().splitlines()[-1] == (
        f"haltwire executor: {agent_sentence(cp, 'an executor', 'executor')}"
    ), err


async def test_a_gateway_whose_token_loses_its_role_fails_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After start-up the check is made on every reconnection: a control plane restarted with the
    token now an agent's is not followed (the gateway stays stale and refuses every call)."""
    db = tmp_path / "control.db"
    data = control_dict({"backend": "sqlite", "path": str(db)}, 0.2)
    stop_first = anyio.Event()

    async def first(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        async with serving(create_app(parse_control_config(data)), graceful_s=1) as url:
            task_status.started(url)
            await stop_first.wait()

    async with running_upstream() as (_, up), anyio.create_task_group() as tg:
        cp = await tg.start(first)
        port = int(cp.rsplit(":", 1)[1])
        async with (
            running_gateway(gateway_config(up, cp)) as (_, url),
            connect(url, TOKENS["ops-bot"]) as ops,
        ):
            assert await code_of(ops) is None
            stop_first.set()

            async def refused() -> bool:
                return await code_of(ops) == "registry_unreachable"

            await until(refused, within=10.0)
            for identity in data["identities"]:
                if identity["role"] == "gateway":
                    identity.update(role="agent", agent="a1")
            caplog.clear()
            async with serving(create_app(parse_control_config(data)), port=port, graceful_s=1):

                async def told() -> bool:
                    return "which is not sent every stop" in caplog.text

                await until(told, within=10.0)
                assert await code_of(ops) == "registry_unreachable"
