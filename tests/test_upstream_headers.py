"""An upstream's headers hold its credentials (a shared API key), so outside development they come
from the environment, named in ``headers_env``, as ``token_env`` and ``secret_env`` do for the
others; plain ``headers`` are refused unless ``gateway.development = true`` (issue 12, point 7).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_process import run_haltwire
from haltwire.config import ConfigError
from haltwire.gateway import create_app
from haltwire.gateway.config import parse_config
from haltwire.identity import token_sha256
from harness import connect, running_gateway, running_upstream

pytestmark = pytest.mark.anyio

KEY_VAR = "HALTWIRE_TEST_UPSTREAM_KEY"


def production(upstream: str, **upstream_keys: Any) -> dict[str, Any]:
    """A config that is not development: hashed tokens only."""
    return {
        "identities": [{"agent": "ops-bot", "token_sha256": token_sha256("tok-ops")}],
        "upstreams": [{"name": "demo", "url": f"{upstream}/mcp", **upstream_keys}],
    }


@pytest.mark.parametrize(
    "headers", [{"Authorization": "Bearer shared-key"}, {"X-Api-Key": "k"}, {"X-Client": "haltwire"}]
)
def test_plain_headers_are_refused_outside_development(headers: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(production("http://127.0.0.1:9", headers=headers), "gw.toml")
    message = str(raised.value)
    assert "gw.toml" in message and "upstreams[0].headers" in message
    assert "gateway.development = true" in message and "headers_env" in message
    name = next(iter(headers))
    assert f'headers_env = {{ "{name}" = ' in message, message  # the fix, for the header at hand
    assert headers[name] not in message, "the refusal never quotes the secret"
    # In development they are accepted, as plain tokens are.
    data = production("http://127.0.0.1:9", headers=headers)
    data["gateway"] = {"development": True}
    assert parse_config(data).upstreams[0].headers == headers


def test_headers_env_names_a_variable_per_header() -> None:
    config = parse_config(production("http://127.0.0.1:9", headers_env={"Authorization": KEY_VAR}))
    assert config.upstreams[0].headers_env == {"Authorization": KEY_VAR}
    for bad, why in (
        ({"Authorization": ""}, "the name of an environment variable"),
        ({"Bad Header": KEY_VAR}, "not a header name"),
        ({"": KEY_VAR}, "not a header name"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_config(production("http://127.0.0.1:9", headers_env=bad))
    # One header named twice, plainly and from the environment (in any case), is ambiguous.
    data = production(
        "http://127.0.0.1:9", headers={"authorization": "x"}, headers_env={"Authorization": KEY_VAR}
    )
    data["gateway"] = {"development": True}
    with pytest.raises(ConfigError, match=r"Authorization.*both headers and headers_env"):
        parse_config(data)


def test_a_missing_variable_is_a_start_up_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    config = parse_config(production("http://127.0.0.1:9", headers_env={"Authorization": KEY_VAR}))
    with pytest.raises(ConfigError) as raised:
        create_app(config)
    message = str(raised.value)
    assert "upstreams[0].headers_env.Authorization" in message and f"{KEY_VAR} is not set" in message
    monkeypatch.setenv(KEY_VAR, "")  # empty is as good as unset: no header
    with pytest.raises(ConfigError, match=f"{KEY_VAR} is not set"):
        create_app(config)


async def test_the_upstream_gets_the_header_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, "Bearer from-the-environment")
    async with running_upstream() as (demo, up):
        data = production(up, headers_env={"Authorization": KEY_VAR}, headers={})
        async with running_gateway(data) as (_, url), connect(url, "tok-ops") as client:
            for _ in range(2):
                assert not (await client.call_tool("lookup_order", {"order_id": "A-1"})).is_error
        assert dict(demo.by_key) == {"Bearer from-the-environment": 2}


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_haltwire(*args, env=env, timeout=60)


def test_the_cli_exits_2_naming_the_header_or_the_variable(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != KEY_VAR}
    path = tmp_path / "gw.toml"
    body = (
        f'[[identities]]\nagent = "ops-bot"\ntoken_sha256 = "{token_sha256("tok-ops")}"\n\n'
        '[[upstreams]]\nname = "demo"\nurl = "http://127.0.0.1:9/mcp"\nconnect_timeout_s = 1\n'
    )
    path.write_text(body + 'headers = { Authorization = "Bearer shared-key" }\n')
    done = run_cli("gateway", "--config", str(path), "--port", "0", env=env)
    assert done.returncode == 2 and "upstreams[0].headers" in done.stderr and "headers_env" in done.stderr
    assert "shared-key" not in done.stderr and "Traceback" not in done.stderr
    path.write_text(body + f'headers_env = {{ Authorization = "{KEY_VAR}" }}\n')
    done = run_cli("gateway", "--config", str(path), "--port", "0", env=env)
    assert done.returncode == 2 and f"{KEY_VAR} is not set" in done.stderr, done.stderr
    # The executor reads the same file and the same upstreams: the same error, before it starts.
    path.write_text(
        path.read_text() + '\n[control]\nurl = "http://127.0.0.1:9"\ntoken_env = "X"\n\n[executor]\ntoken_env = "X"\n'
    )
    done = run_cli("executor", "--config", str(path), env={**env, "X": "t"})
    assert done.returncode == 2 and f"{KEY_VAR} is not set" in done.stderr, done.stderr


def test_the_examples_parse() -> None:
    from haltwire.gateway.config import load_config

    root = Path(__file__).resolve().parent.parent
    config = load_config(root / "examples/gateway.toml")
    assert config.upstreams
